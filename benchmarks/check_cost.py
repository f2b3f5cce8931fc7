"""The cost of the ghost engine's periodic check against vmap, measured in one process on one clipper.

``benchmarks/dp_overhead.py --modes ghost ghost-unchecked`` runs the two schedules in separate worker processes, and on
a shared CPU two processes running the same steps differ by more than the check costs. Here one clipper alternates,
round by round, between a block of ``--every`` steps with its check due once (``check_every = every``: the block holds
exactly one check) and a block of as many steps without (``check_every = None``); the order within a round rotates.
Each round's ratio is the checked block's time over the unchecked block's, so the ratio's excess over 1 is the share
of training time the check costs at that schedule (``CHECK_EVERY`` = 100 by default). Every step is the private step of
``DPCallback``: clipped sum, Gaussian noise, average, SGD update.

Usage: ``python benchmarks/check_cost.py [--cases cnn_tanh/b64 cnn_tanh/b256 resnet18/b64] [--rounds 5] [--every 100]``
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings

import torch
from dp_overhead import CASES, spread

from results import add_results_arguments, result_name, write_result

DEFAULT_CASES = ("cnn_tanh/b64", "cnn_tanh/b256", "resnet18/b64")
HEADER = ("model", "batch", "ms/step without the check", "ms/step with it", "with / without, median [min-max]")


def private_steps(case: str, every: int):
    """``(clipper, step)``: the ghost engine on ``case``'s model and one private step of it on a fixed batch."""
    from lightning_dprobust.core.ghost import GhostClipper
    from lightning_dprobust.core.per_sample import add_noise_and_scale_
    from lightning_dprobust.methods import DPSGD

    model_name, shape, batch_size, model_kwargs = CASES[case]
    torch.manual_seed(0)
    module = DPSGD(model=model_name, num_classes=10, input_shape=shape, model_kwargs=model_kwargs)
    batch = (torch.rand(batch_size, *shape), torch.randint(0, 10, (batch_size,)))
    clipper = GhostClipper(module, "per_example_loss", 1.0, check_every=every)
    params = clipper.trainable_parameters()
    optimizer = torch.optim.SGD(list(params.values()), lr=0.01)

    def step() -> None:
        optimizer.zero_grad()
        private = add_noise_and_scale_(clipper(batch).grads, 1.0, 1.0 / batch_size)
        for name, p in params.items():
            p.grad = private[name]
        optimizer.step()

    step()  # the first step's check
    return clipper, step


def measure(clipper, step, rounds: int, every: int) -> dict[str, list[float]]:
    """Seconds per step of each block, per round: ``{"checked": [...], "unchecked": [...]}``. A checked block runs
    exactly one check: the unchecked block before it leaves the count of steps since the last check at ``every`` or
    more, so the check falls on its first step; the first block follows the first step's check and reaches ``every``
    at its last step."""
    times: dict[str, list[float]] = {"checked": [], "unchecked": []}
    for r in range(rounds):
        for schedule in ("checked", "unchecked") if r % 2 == 0 else ("unchecked", "checked"):
            clipper.check_every = every if schedule == "checked" else None
            start = time.perf_counter()
            for _ in range(every):
                step()
            times[schedule].append((time.perf_counter() - start) / every)
    return times


def row(case: str, times: dict[str, list[float]]) -> list[str]:
    model_name, _, batch_size, _ = CASES[case]
    ratios = [a / b for a, b in zip(times["checked"], times["unchecked"], strict=True)]
    without, with_check = (1000 * statistics.median(times[key]) for key in ("unchecked", "checked"))
    return [model_name, str(batch_size), f"{without:.1f}", f"{with_check:.1f}", spread(ratios)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", nargs="+", default=list(DEFAULT_CASES), choices=list(CASES))
    parser.add_argument("--rounds", type=int, default=5, help="rounds, each one block with the check and one without")
    parser.add_argument("--every", type=int, default=None, help="steps per block and check schedule (CHECK_EVERY)")
    add_results_arguments(parser)
    args = parser.parse_args()
    from lightning_dprobust.core.ghost import CHECK_EVERY

    every = args.every or CHECK_EVERY
    warnings.filterwarnings("ignore")
    print(f"threads: {torch.get_num_threads()}, rounds: {args.rounds}, blocks of {every} steps")
    print("| " + " | ".join(HEADER) + " |\n|---|---|---|---|---|")
    rows, raw = [], {}
    for case in args.cases:
        raw[case] = measure(*private_steps(case, every), args.rounds, every)
        rows.append(row(case, raw[case]))
        print("| " + " | ".join(rows[-1]) + " |", flush=True)
    write_result(
        result_name(args, "check_cost_cpu"),
        title="Cost of the ghost engine's periodic check against vmap: one clipper, blocks with and without it",
        columns=HEADER,
        rows=rows,
        notes=f"one process, threads {torch.get_num_threads()}; {args.rounds} rounds of two blocks of {every} "
        f"private steps (one check in the first, none in the second, order rotating); ratio: median over rounds "
        "[min-max]; ms/step: median over rounds",
        raw=raw,
        directory=args.results_dir,
    )


if __name__ == "__main__":
    main()
