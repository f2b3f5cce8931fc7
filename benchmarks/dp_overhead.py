"""DP-SGD overhead: step time of DP training / non-DP training, and peak memory, measured in one run.

Each (model, mode) runs in a fresh process so that its peak resident memory (CPU) or peak allocated memory
(CUDA) is its own. Modes:

* ``non-DP``: the same LightningModule and Trainer without ``DPCallback``;
* ``DP (ours)``: ``DPCallback`` (Poisson sampling, torch.func per-example clipping, noise, accounting);
* ``Opacus hooks``: for reference, a plain PyTorch loop over Opacus 1.6 ``GradSampleModule`` (hooks mode) with
  ``DPOptimizer``, the usual hand-written setup; a crash is reported as such.

Usage: ``python benchmarks/dp_overhead.py [--steps 10] [--warmup 2] [--device cpu]``
"""

from __future__ import annotations

import argparse
import json
import logging
import multiprocessing as mp
import resource
import time
import warnings

import torch

CASES = {"cnn_tanh": ((1, 28, 28), 256), "timm/resnet18": ((3, 32, 32), 64)}
MODES = ("non-DP", "DP (ours)", "Opacus hooks")


def _peak_memory_mb(device: str) -> float:
    if device.startswith("cuda"):
        return torch.cuda.max_memory_allocated() / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _synthetic(shape, batch_size: int, steps: int):
    from torch.utils.data import TensorDataset

    count = batch_size * steps
    generator = torch.Generator().manual_seed(0)
    return TensorDataset(torch.rand(count, *shape, generator=generator), torch.randint(0, 10, (count,)))


class _StepTimer:
    """Lightning callback timing each training batch (forward, backward, clipping, noise, optimizer step)."""

    def __init__(self, device: str) -> None:
        self.device, self.times, self._start = device, [], 0.0

    def _sync(self) -> None:
        if self.device.startswith("cuda"):
            torch.cuda.synchronize()

    def on_train_batch_start(self, *args) -> None:
        self._sync()
        self._start = time.perf_counter()

    def on_train_batch_end(self, *args) -> None:
        self._sync()
        self.times.append(time.perf_counter() - self._start)


def _lightning_steps(model_name: str, private: bool, steps: int, device: str) -> list[float]:
    import lightning as L
    from torch.utils.data import DataLoader

    from lightning_dprobust.callbacks import DPCallback
    from lightning_dprobust.methods import DPSGD

    shape, batch_size = CASES[model_name]
    dataset = _synthetic(shape, batch_size, steps)

    class Data(L.LightningDataModule):
        def train_dataloader(self):
            return DataLoader(dataset, batch_size=batch_size, shuffle=True)

    timer = type("Timer", (_StepTimer, L.Callback), {})(device)
    callbacks = [timer] + ([DPCallback(max_grad_norm=1.0, noise_multiplier=1.0, delta=1e-5)] if private else [])
    trainer = L.Trainer(
        accelerator="gpu" if device.startswith("cuda") else "cpu",
        devices=1,
        max_steps=steps,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=callbacks,
        use_distributed_sampler=False,
    )
    trainer.fit(DPSGD(model=model_name, num_classes=10, input_shape=shape, lr=0.01), Data())
    return timer.times


def _opacus_steps(model_name: str, steps: int, device: str) -> list[float]:
    from opacus import GradSampleModule
    from opacus.optimizers import DPOptimizer

    from lightning_dprobust.models import create_model

    shape, batch_size = CASES[model_name]
    model = GradSampleModule(create_model(model_name, num_classes=10, input_shape=shape).to(device))
    optimizer = DPOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.01),
        noise_multiplier=1.0,
        max_grad_norm=1.0,
        expected_batch_size=batch_size,
    )
    x, y = (t.to(device) for t in _synthetic(shape, batch_size, 1).tensors)
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return times


def _measure(model_name: str, mode: str, steps: int, warmup: int, device: str, queue) -> None:
    warnings.filterwarnings("ignore")
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    torch.manual_seed(0)
    try:
        if mode == "Opacus hooks":
            times = _opacus_steps(model_name, steps + warmup, device)
        else:
            times = _lightning_steps(model_name, mode == "DP (ours)", steps + warmup, device)
        measured = times[warmup:]
        queue.put({"ms": 1000 * sum(measured) / len(measured), "mem": _peak_memory_mb(device)})
    except Exception as error:  # report any engine's crash as a table entry, not a benchmark failure
        queue.put({"error": f"{type(error).__name__}: {str(error).splitlines()[0][:70]}"})


def run(model_name: str, mode: str, steps: int, warmup: int, device: str) -> dict:
    context = mp.get_context("spawn")
    queue = context.Queue()
    process = context.Process(target=_measure, args=(model_name, mode, steps, warmup, device, queue))
    process.start()
    result = queue.get()
    process.join()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10, help="measured steps per configuration")
    parser.add_argument("--warmup", type=int, default=2, help="unmeasured first steps")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--json", help="also write the results to this JSON file")
    args = parser.parse_args()

    print(f"device: {args.device}, torch threads: {torch.get_num_threads()}, steps: {args.steps} (+{args.warmup})")
    print("| model | batch | mode | ms/step | DP / non-DP | peak memory (MB) |")
    print("|---|---|---|---|---|---|")
    results = {}
    for model_name, (shape, batch_size) in CASES.items():
        baseline = None
        for mode in MODES:
            result = run(model_name, mode, args.steps, args.warmup, args.device)
            results[f"{model_name}/{mode}"] = result
            if "error" in result:
                print(f"| {model_name} {shape} | {batch_size} | {mode} | fails: {result['error']} | | |")
                continue
            baseline = baseline or result["ms"]
            ratio = result["ms"] / baseline
            print(
                f"| {model_name} {shape} | {batch_size} | {mode} | {result['ms']:.1f} | {ratio:.2f}x "
                f"| {result['mem']:.0f} |",
                flush=True,
            )
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(results, handle, indent=2)


if __name__ == "__main__":
    main()
