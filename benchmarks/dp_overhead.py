"""DP-SGD overhead: step time and peak memory of each DP engine relative to non-private training, in one run.

Every (case, mode) lives in its own worker process, so that its peak memory is its own; the parent interleaves the
modes in ``--rounds`` rounds (the order rotates each round) so that a slow spell of a shared machine hits every
mode alike. Each round's ratio is the DP mode's median step time over the non-private median of the same round;
the table reports the median ratio over rounds with its min-max. Modes:

* ``non-DP``: ``per_example_loss(x, y).mean().backward()`` and an SGD step;
* ``ghost`` / ``vmap``: our engines (``core/engines.py``): clipped per-example sum, Gaussian noise, division by
  the batch size, SGD step (the computation of ``DPCallback.private_step``; Poisson sampling is data loading and
  not timed);
* ``Opacus ew`` / ``Opacus ghost``: Opacus 1.6 ExpandedWeights and ghost clipping with their DP optimizers, the
  usual hand-written loop; a crash is reported as such (timm ResNets: in-place residual adds, opacus #828).

Memory, each measure divided by non-private's for its ratio:

* ``first MB`` and ``later MB``: the peak memory of the first step (warm-up, with any one-time work such as the
  ghost engine's check against vmap) and of the later steps, above what the process held just before them. CUDA:
  peak allocated memory of the timed worker (both columns: over all its steps). CPU: a separate worker per mode, run
  after the timed rounds, with glibc's mmap threshold pinned at 64 KB, so that every tensor above 64 KB has its own
  mapping and leaves the resident set when freed; its peak resident set (``VmHWM``, reset before each measure) then
  tracks the live tensors. Library code the steps page in on first use (file-backed resident pages, ``RssFile``,
  which stay resident) is subtracted. Linux with glibc only.
* ``RSS MB``: the timed worker's peak resident set (``ru_maxrss``) over all its steps minus the same measure once the
  model and the batch exist, with glibc's default allocator. That allocator raises its mmap threshold to 32 MB after
  the first large frees and keeps later freed tensors in its heap, so this measure also counts memory no tensor
  holds (it varies with the order of allocations, not only with their sizes), and it counts library code.

Usage: ``python benchmarks/dp_overhead.py [--cases cnn_tanh/b256 ...] [--rounds 5] [--steps 3] [--device cpu]``
(``--cases`` defaults to ``DEFAULT_CASES``; the batch-256 and 224x224 ResNet and ViT cases are for GPUs).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import multiprocessing as mp
import resource
import statistics
import time
import warnings

import torch

from results import add_results_arguments, result_name, write_result

TOKEN_BAG = "token_bag"
"""The case model :class:`TokenBag` (not a registry model: token ids in, not images)."""


class TokenBag(torch.nn.Module):
    """A bag-of-tokens text classifier: the mean of the tokens' embeddings, then a linear head."""

    def __init__(self, num_classes: int, vocabulary: int, dim: int) -> None:
        super().__init__()
        self.embedding = torch.nn.Embedding(vocabulary, dim)
        self.head = torch.nn.Linear(dim, num_classes)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.embedding(ids).mean(dim=1))


#: name -> (model, input shape, batch size, model kwargs)
CASES = {
    "cnn_tanh/b2": ("cnn_tanh", (1, 28, 28), 2, {}),  # next to no arithmetic: each mode's fixed cost per step
    "cnn_tanh/b64": ("cnn_tanh", (1, 28, 28), 64, {}),
    "cnn_tanh/b256": ("cnn_tanh", (1, 28, 28), 256, {}),
    "cnn_tanh/b1024": ("cnn_tanh", (1, 28, 28), 1024, {}),
    "resnet18/b64": ("timm/resnet18", (3, 32, 32), 64, {}),
    "vit_tiny/b64": ("timm/vit_tiny_patch16_224", (3, 32, 32), 64, {"img_size": 32, "patch_size": 4}),
    # GPU: at batch 64 these models' steps are bound by kernel launches; larger batches show the arithmetic's cost
    "resnet18/b256": ("timm/resnet18", (3, 32, 32), 256, {}),
    "vit_tiny/b256": ("timm/vit_tiny_patch16_224", (3, 32, 32), 256, {"img_size": 32, "patch_size": 4}),
    # GPU: the models' own 224x224 images, where a step is bound by arithmetic rather than launches
    "resnet18_224/b64": ("timm/resnet18", (3, 224, 224), 64, {}),
    "vit_tiny_224/b64": ("timm/vit_tiny_patch16_224", (3, 224, 224), 64, {}),
    # the layers of ResNet-18 and ViT-Tiny at widths where the arithmetic is next to nothing: a step's time is the
    # engines' Python and operator dispatch, which a GPU step at batch 64 waits on (a CPU proxy for that cost)
    "resnet18_narrow/b2": ("timm/resnet18", (3, 64, 64), 2, {"channels": (4, 8, 16, 32), "stem_width": 4}),
    "vit_tiny_narrow/b2": (
        "timm/vit_tiny_patch16_224",
        (3, 8, 8),
        2,
        {"img_size": 8, "patch_size": 4, "embed_dim": 16, "num_heads": 2},
    ),
    # CPU: depthwise convolutions, normalization layers with activations, ConvNeXt's LayerNorm2d and layer scale
    "mobilenetv3/b64": ("timm/mobilenetv3_small_050", (3, 32, 32), 64, {}),
    "efficientnet_b0/b64": ("timm/efficientnet_b0", (3, 32, 32), 64, {}),
    "convnext_atto/b64": ("timm/convnext_atto", (3, 32, 32), 64, {}),
    # ECA channel attention: a Conv1d across each block's pooled channels
    "eca_resnet18/b64": ("timm/resnet18", (3, 32, 32), 64, {"block_args": {"attn_layer": "eca"}}),
    # two ViT branches (patches of 12 and 16 pixels) with their own class tokens and position embeddings
    "crossvit_tiny/b64": ("timm/crossvit_tiny_240", (3, 96, 96), 64, {"img_size": 96, "img_scale": (1.0, 1.0)}),
    # MetaFormer: GroupNorm1, per-channel layer and residual scales, StarReLU
    "poolformer_s12/b64": ("timm/poolformer_s12", (3, 32, 32), 64, {}),
    # Swin: window attention with a relative position bias table (composite rule: the attention re-run per example)
    "swin_tiny/b64": ("timm/swin_tiny_patch4_window7_224", (3, 64, 64), 64, {"img_size": 64, "window_size": 4}),
    # ResMLP: each block's two layer scales (block scale rule), the token-mixing one on a transposed output
    "resmlp_12/b64": ("timm/resmlp_12_224", (3, 32, 32), 64, {"img_size": 32}),
    # CaiT: layer-scale blocks and class-attention blocks (block scale rule), the class token into the latter
    "cait_xxs24/b64": ("timm/cait_xxs24_224", (3, 32, 32), 64, {"img_size": 32, "patch_size": 4}),
    # captured on the graph (core/ghost/functional.py): class tokens, position embeddings, blocks' scales, and
    # the attention's qkv.weight used through F.linear (BEiT's blocks at ViT-Tiny's width: 192 channels, 3 heads)
    "beit_192/b64": (
        "timm/beit_base_patch16_224",
        (3, 32, 32),
        64,
        {"img_size": 32, "patch_size": 4, "embed_dim": 192, "num_heads": 3},
    ),
    "eva02_tiny/b64": ("timm/eva02_tiny_patch14_224", (3, 32, 32), 64, {"img_size": 32, "patch_size": 4}),
    "coat_lite_tiny/b64": ("timm/coat_lite_tiny", (3, 32, 32), 64, {"img_size": 32}),
    # a Fourier position encoding: a layer applied once to a grid the batch shares, then repeated per example
    "xcit_nano/b64": ("timm/xcit_nano_12_p8_224", (3, 32, 32), 64, {"img_size": 32}),
    # a relative position bias table the attention reads without calling its module: the attention re-run per example
    "maxvit_nano/b64": ("timm/maxvit_nano_rw_256", (3, 32, 32), 64, {"img_size": 32}),
    # 64 token ids per example, a 30,000 x 128 embedding table: the per-example table is what an engine must avoid
    "token_bag/b64": (TOKEN_BAG, (64,), 64, {"vocabulary": 30_000, "dim": 128}),
}
DEFAULT_CASES = ("cnn_tanh/b64", "cnn_tanh/b256", "cnn_tanh/b1024", "resnet18/b64", "vit_tiny/b64")
MODES = ("non-DP", "ghost", "vmap", "Opacus ew", "Opacus ghost")
UNCHECKED = "ghost-unchecked"
"""The ghost engine with its check against vmap only at the first step (``GhostClipper(check_every=None)``): the
periodic check's cost is ghost's time over this mode's. The check runs once every
:data:`~lightning_dprobust.core.ghost.CHECK_EVERY` steps, so time at least that many steps per round and take the
mean (``--modes non-DP ghost ghost-unchecked --steps 100 --per-round mean``): a median never sees it."""
PROBED = "ghost+probe"
"""The ghost engine with its opt-in per-step probe (``GhostClipper(probe=True)``, ``DPCallback(probe=True)``)."""
EXTRA_MODES = (UNCHECKED, PROBED)
LIVE_STEPS = 2
"""Later steps of the live-memory worker (after its first, which does any one-time work)."""


def _memory_mb(device: str) -> float:
    if device.startswith("cuda"):
        return torch.cuda.max_memory_allocated() / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


_M_MMAP_THRESHOLD = -3
_PINNED_MMAP_THRESHOLD = 64 * 1024


def _status_mb(field: str) -> float:
    """A memory field of ``/proc/self/status`` (``VmRSS``, ``VmHWM``) in MB."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"/proc/self/status has no {field}: live memory needs Linux")


def _pin_malloc() -> None:
    """glibc: every allocation above 64 KB gets its own mapping (freed at once), and the heap is trimmed."""
    libc = ctypes.CDLL("libc.so.6")
    if not libc.mallopt(_M_MMAP_THRESHOLD, _PINNED_MMAP_THRESHOLD):
        raise RuntimeError("mallopt(M_MMAP_THRESHOLD) failed: live memory needs glibc")
    libc.malloc_trim(0)


def _step_memory(steps: int, step) -> float:
    """Peak resident MB of ``steps`` calls of ``step`` above the resident set before them, less the library code
    (file-backed pages) they paged in."""
    base, code = _status_mb("VmRSS"), _status_mb("RssFile")
    with open("/proc/self/clear_refs", "w") as clear:
        clear.write("5")  # resets VmHWM to the current resident set
    for _ in range(steps):
        step()
    return _status_mb("VmHWM") - base - (_status_mb("RssFile") - code)


def _live_worker(case: str, mode: str, device: str, steps: int, connection) -> None:
    """CPU live memory, with the pinned allocator, of the first step and of ``steps`` later ones; one reply."""
    warnings.filterwarnings("ignore")
    try:
        _pin_malloc()
        step = build_step(case, mode, device)
        first = _step_memory(1, step)
        connection.send({"ok": True, "live": (first, _step_memory(steps, step))})
    except Exception as error:
        connection.send({"ok": False, "error": f"{type(error).__name__}: {str(error).splitlines()[0][:70]}"})


def build_engine(module, mode: str):
    """The clipper of a private mode: ``ghost``/``vmap`` as ``DPCallback`` builds them (``build_clipper``), or the
    ghost engine with another check schedule (:data:`UNCHECKED`) or with its probe (:data:`PROBED`)."""
    from lightning_dprobust.core.engines import build_clipper
    from lightning_dprobust.core.ghost import CHECK_EVERY, GhostClipper

    if mode in EXTRA_MODES:
        check_every = None if mode == UNCHECKED else CHECK_EVERY
        return GhostClipper(module, "per_example_loss", 1.0, check_every=check_every, probe=mode == PROBED)
    return build_clipper(mode, module, "per_example_loss", 1.0)[0]


def _ours(module, mode: str, x, y):
    """One step of our DP-SGD: clipped sum, noise, average, SGD (``DPCallback.private_step``'s computation)."""
    from lightning_dprobust.core.per_sample import add_noise_and_scale_

    optimizer = torch.optim.SGD(module.parameters(), lr=0.01)
    if mode == "non-DP":

        def step() -> None:
            optimizer.zero_grad()
            module.per_example_loss(x, y).mean().backward()
            optimizer.step()

        return step
    clipper = build_engine(module, mode)
    params = clipper.trainable_parameters()

    def step() -> None:
        optimizer.zero_grad()  # as non-DP's step (and DPCallback.private_step): last step's gradient is freed first
        private = add_noise_and_scale_(clipper((x, y)).grads, 1.0, 1.0 / x.shape[0])
        for name, p in params.items():
            p.grad = private[name]
        optimizer.step()

    return step


def _opacus(model, mode: str, x, y):
    """One step of Opacus 1.6 (ExpandedWeights or ghost clipping) with its DP optimizer."""
    from opacus.grad_sample import GradSampleModuleExpandedWeights, GradSampleModuleFastGradientClipping
    from opacus.optimizers import DPOptimizer, DPOptimizerFastGradientClipping
    from opacus.utils.fast_gradient_clipping_utils import DPLossFastGradientClipping

    kwargs = dict(noise_multiplier=1.0, max_grad_norm=1.0, expected_batch_size=x.shape[0])
    if mode == "Opacus ew":
        wrapped = GradSampleModuleExpandedWeights(model)
        optimizer = DPOptimizer(torch.optim.SGD(wrapped.parameters(), lr=0.01), **kwargs)
        criterion = torch.nn.CrossEntropyLoss()
    else:
        wrapped = GradSampleModuleFastGradientClipping(model, max_grad_norm=1.0, use_ghost_clipping=True)
        optimizer = DPOptimizerFastGradientClipping(torch.optim.SGD(wrapped.parameters(), lr=0.01), **kwargs)
        criterion = DPLossFastGradientClipping(wrapped, optimizer, torch.nn.CrossEntropyLoss())

    def step() -> None:
        optimizer.zero_grad()
        criterion(wrapped(x), y).backward()
        optimizer.step()

    return step


def build_step(case: str, mode: str, device: str):
    from lightning_dprobust.methods import DPSGD

    model_name, shape, batch_size, model_kwargs = CASES[case]
    torch.manual_seed(0)
    if model_name == TOKEN_BAG:
        module = DPSGD(model=TokenBag(10, **model_kwargs), num_classes=10, input_shape=shape).to(device)
        x = torch.randint(0, model_kwargs["vocabulary"], (batch_size, *shape), device=device)
    else:
        module = DPSGD(model=model_name, num_classes=10, input_shape=shape, model_kwargs=model_kwargs).to(device)
        x = torch.rand(batch_size, *shape, device=device)
    y = torch.randint(0, 10, (batch_size,), device=device)
    if mode.startswith("Opacus"):
        return _opacus(module.model, mode, x, y)
    return _ours(module, mode, x, y)


def spread(ratios: list[float]) -> str:
    """``ratios`` as the benchmarks report them: their median with their min-max, ``1.23x [1.10-1.40]``."""
    return f"{statistics.median(ratios):.2f}x [{min(ratios):.2f}-{max(ratios):.2f}]"


def _worker(case: str, mode: str, device: str, connection) -> None:
    """Serve ``("run", steps)`` requests with step times until ``None``; the first reply says whether setup worked."""
    warnings.filterwarnings("ignore")
    try:
        step = build_step(case, mode, device)
        if device.startswith("cuda"):
            torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated() / 2**20 if device.startswith("cuda") else _memory_mb(device)
        step()  # warm-up, counted in the peak; also fails fast for an engine that cannot run this model
        connection.send({"ok": True, "base": base})
    except Exception as error:  # report any engine's crash as a table entry, not a benchmark failure
        connection.send({"ok": False, "error": f"{type(error).__name__}: {str(error).splitlines()[0][:70]}"})
        return
    while (steps := connection.recv()) is not None:
        connection.send({"times": timed_steps(step, steps, device), "peak": _memory_mb(device)})


def timed_steps(step, steps: int, device: str) -> list[float]:
    """Wall-clock seconds of each of ``steps`` calls of ``step`` (on CUDA, each until its kernels have finished)."""
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        step()
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return times


def _receive(process, pipe) -> dict:
    """The worker's next reply, or an error entry when it died (e.g. killed for memory)."""
    try:
        return pipe.recv()
    except EOFError:
        process.join()
        return {"ok": False, "error": f"worker died (exit code {process.exitcode}; -9: killed, e.g. out of memory)"}


def measure_case(
    case: str, modes: tuple[str, ...], rounds: int, steps: int, device: str, per_round: str = "median"
) -> dict[str, dict]:
    """Interleaved rounds of every mode of one case; per mode: step times per round (their ``per_round`` statistic,
    ``median`` or ``mean``), memory, or the error."""
    statistic = {"median": statistics.median, "mean": statistics.fmean}[per_round]
    context = mp.get_context("spawn")
    workers, results, started = {}, {}, {}
    for mode in modes:  # start every worker first: their imports and warm-ups overlap
        parent, child = context.Pipe()
        started[mode] = (context.Process(target=_worker, args=(case, mode, device, child), daemon=True), parent)
        started[mode][0].start()
    for mode, (process, parent) in started.items():
        ready = _receive(process, parent)
        if ready["ok"]:
            workers[mode] = (process, parent)
            results[mode] = {"base": ready["base"], "rounds": [], "peak": ready["base"]}
        else:
            results[mode] = {"error": ready["error"]}
            process.join()
    order = list(workers)
    for r in range(rounds):
        for mode in order[r % len(order) :] + order[: r % len(order)]:
            if "error" in results[mode]:
                continue
            process, pipe = workers[mode]
            pipe.send(steps)
            reply = _receive(process, pipe)
            if not reply.get("ok", True):
                results[mode] = {"error": reply["error"]}
                continue
            results[mode]["rounds"].append(statistic(reply["times"]))
            results[mode]["peak"] = max(results[mode]["peak"], reply["peak"])
    for mode, (process, pipe) in workers.items():
        if "error" not in results[mode]:
            pipe.send(None)
        process.join()
    for mode, result in results.items():
        if "error" not in result:
            result["live"] = _live(case, mode, device, context, result)
    return results


def _live(case: str, mode: str, device: str, context, result: dict) -> tuple[float, float] | str:
    """``(first step, later steps)`` memory of one mode (CUDA: the timed worker's, over all its steps; CPU: a
    pinned-allocator worker's), or its error."""
    if device.startswith("cuda"):
        return (result["peak"] - result["base"],) * 2
    parent, child = context.Pipe()
    process = context.Process(target=_live_worker, args=(case, mode, device, LIVE_STEPS, child), daemon=True)
    process.start()
    reply = _receive(process, parent)
    process.join()
    return reply["live"] if reply["ok"] else reply["error"]


HEADER = ["model", "batch", "mode", "ms/step", "time / non-DP, median [min-max]", "first MB", "first / non-DP",
          "later MB", "later / non-DP", "RSS MB", "RSS / non-DP"]  # fmt: skip


def table_rows(case: str, results: dict[str, dict]) -> list[str]:
    """Markdown rows of :func:`table_cells`."""
    return ["| " + " | ".join(cells) + " |" for cells in table_cells(case, results)]


def table_cells(case: str, results: dict[str, dict]) -> list[list[str]]:
    """Rows of :data:`HEADER`: ms/step (median over rounds), time ratio median [min-max], live and RSS memory, their
    ratios."""
    model_name, shape, batch_size, _ = CASES[case]
    base = results.get("non-DP", {})
    rows = []
    for mode, result in results.items():
        head = [f"{model_name} {'x'.join(map(str, shape))}", str(batch_size), mode]
        if "error" in result:
            rows.append([*head, f"fails: {result['error']}", *[""] * (len(HEADER) - 4)])
            continue
        ms = 1000 * statistics.median(result["rounds"])
        rss = result["peak"] - result["base"]
        live = result["live"] if isinstance(result["live"], tuple) else (result["live"],) * 2
        ratio, live_ratios, rss_ratio = "", ["", ""], ""
        if "rounds" in base and mode != "non-DP":
            ratios = [a / b for a, b in zip(result["rounds"], base["rounds"], strict=True)]
            ratio = spread(ratios)
            reference = base["live"] if isinstance(base["live"], tuple) else ("",) * 2
            live_ratios = [_ratio(value, ref) for value, ref in zip(live, reference, strict=True)]
            rss_ratio = _ratio(rss, base["peak"] - base["base"])
        cells = [f"{value:.0f}" if isinstance(value, float) else f"fails: {value}" for value in live]
        memory = [cells[0], live_ratios[0], cells[1], live_ratios[1], f"{rss:.0f}", rss_ratio]
        rows.append([*head, f"{ms:.1f}", ratio, *memory])
    return rows


def check_cost(case: str, results: dict[str, dict]) -> str | None:
    """``'<case>: ghost / ghost-unchecked 1.02x [0.99-1.09]'``, the per-round ratio of the ghost engine with its
    periodic check over the same engine without it (:data:`UNCHECKED`), when both ran; ``None`` otherwise."""
    ghost, unchecked = results.get("ghost", {}), results.get(UNCHECKED, {})
    if "rounds" not in ghost or "rounds" not in unchecked:
        return None
    ratios = [a / b for a, b in zip(ghost["rounds"], unchecked["rounds"], strict=True)]
    return f"{case}: ghost / {UNCHECKED} {spread(ratios)}"


def _ratio(value: float | str, reference: float | str) -> str:
    ok = isinstance(value, float) and isinstance(reference, float) and reference > 0
    return f"{value / reference:.2f}x" if ok else ""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", nargs="+", default=list(DEFAULT_CASES), choices=list(CASES))
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=[*MODES, *EXTRA_MODES])
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds (ratio: median and min-max)")
    parser.add_argument("--steps", type=int, default=3, help="timed steps per mode and round")
    parser.add_argument(
        "--per-round",
        choices=("median", "mean"),
        default="median",
        help="statistic of a round's step times: median (the step's own cost) or mean (amortizes periodic work)",
    )
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--json", help="also write the raw results to this JSON file")
    add_results_arguments(parser)
    args = parser.parse_args()
    if "non-DP" not in args.modes:
        parser.error("--modes must include non-DP, the reference of every ratio")
    modes = ("non-DP",) + tuple(m for m in args.modes if m != "non-DP")
    print(
        f"device: {args.device}, threads: {torch.get_num_threads()}, "
        f"rounds: {args.rounds} x {args.steps} steps ({args.per_round} per round)"
    )
    print("| " + " | ".join(HEADER) + " |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    everything, rows = {}, []
    for case in args.cases:
        everything[case] = measure_case(case, modes, args.rounds, args.steps, args.device, args.per_round)
        rows += table_cells(case, everything[case])
        print("\n".join(table_rows(case, everything[case])), flush=True)
    check_costs = [line for case in args.cases if (line := check_cost(case, everything[case]))]
    print("\n".join(check_costs))
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(everything, handle, indent=2)
    device = torch.device(args.device).type
    write_result(
        result_name(args, f"dp_overhead_{device}"),
        title=f"DP-SGD overhead on {device}: step time and peak memory of each engine relative to non-private training",
        columns=HEADER,
        rows=rows,
        notes=f"one run; {args.rounds} interleaved rounds x {args.steps} steps ({args.per_round} per round), threads "
        f"{torch.get_num_threads()}; time ratio: median over rounds [min-max]; memory: see benchmarks/dp_overhead.py"
        + "".join(f"; {line}" for line in check_costs),
        raw=everything,
        device=args.device,
        directory=args.results_dir,
    )


if __name__ == "__main__":
    main()
