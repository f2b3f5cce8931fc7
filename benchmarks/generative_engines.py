"""IGAMT's training iteration with each per-example clipping engine, relative to the same iteration without DP.

IGAMT (Tang 2021, thesis chapter 4) at the sizes of ``configs/igamt/synthetic.yaml`` on a batch of 64 records of the
embedded synthetic EHR set; ``strict_dp`` (every component that reads real data is clipped and noised) and the
thesis wiring. Modes: ``non-DP`` (``noise_multiplier=None``), ``vmap`` and ``auto`` (the ghost engine where its
layer rules hold; the critics' WGAN-GP loss goes to vmap through the graph check). One process, the modes
interleaved in ``--rounds`` rounds (order rotating); each round's ratio is the mode's median iteration time over
non-DP's of the same round, reported as the median ratio over rounds with its min-max. Iterations 0 to 4 of the
critic schedule are timed in turn (the critics update on one of five).

Usage: ``OMP_NUM_THREADS=1 python benchmarks/generative_engines.py [--rounds 5] [--batch 64]``
"""

from __future__ import annotations

import argparse
import logging
import statistics
import time
import warnings
from types import SimpleNamespace

import torch
from dp_overhead import spread

from lightning_dprobust.data.ehr import EHRDataModule
from lightning_dprobust.methods.igamt import IGAMT
from results import add_results_arguments, result_name, write_result

MODES = {"non-DP": dict(noise_multiplier=None), "vmap": dict(engine="vmap"), "auto": dict(engine="auto")}


def _module(strict_dp: bool, options: dict) -> IGAMT:
    torch.manual_seed(0)
    module = IGAMT(strict_dp=strict_dp, seed=0, **options)
    module.loaders.sample_rate, module.loaders.num_examples = 64 / 2000, 2000
    if module.dp_enabled:
        module.randomness.start(SimpleNamespace(world_size=1))
    module.configure_optimizers()
    return module


def _time(module: IGAMT, x: torch.Tensor, m: torch.Tensor, iterations: int) -> float:
    """Seconds per iteration, over one pass of ``iterations`` consecutive iterations of the critic schedule."""
    start = time.perf_counter()
    for iteration in range(iterations):
        module.train_iteration(x, m, iteration)
    return (time.perf_counter() - start) / iterations


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--batch", type=int, default=64)
    add_results_arguments(parser)
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    data = EHRDataModule(batch_size=args.batch)
    data.setup("fit")
    x, m = next(iter(data.train_dataloader()))
    schedule = f"{args.rounds} rounds of the 5-iteration critic schedule"
    print(f"IGAMT, batch {len(x)}, {schedule}, threads: {torch.get_num_threads()}")
    header = ["wiring", "mode", "ms / iteration", "time / non-DP, median [min-max]"]
    print("| " + " | ".join(header) + " |\n|---|---|---|---|")
    rows, raw = [], {}
    for strict_dp in (True, False):
        modules = {mode: _module(strict_dp, options) for mode, options in MODES.items()}
        for module in modules.values():
            _time(module, x, m, 5)  # warm-up (and the ghost engine's first-step check)
        times: dict[str, list[float]] = {mode: [] for mode in modules}
        order = list(modules)
        for r in range(args.rounds):
            for mode in order[r % len(order) :] + order[: r % len(order)]:
                times[mode].append(_time(modules[mode], x, m, 5))
        for mode, values in times.items():
            ratios = [t / base for t, base in zip(values, times["non-DP"], strict=True)]
            ratio = "" if mode == "non-DP" else spread(ratios)
            wiring = "strict_dp" if strict_dp else "thesis"
            rows.append([wiring, mode, f"{statistics.median(values) * 1000:.1f}", ratio])
            raw[f"{wiring}/{mode}"] = values
            print("| " + " | ".join(rows[-1]) + " |", flush=True)
    write_result(
        result_name(args, "generative_engines_cpu"),
        title="IGAMT's training iteration with each clipping engine, relative to the same iteration without DP",
        columns=header,
        rows=rows,
        notes=f"one process, batch {len(x)}, {schedule}, modes interleaved; ratio: median over rounds [min-max]",
        raw={"seconds_per_iteration": raw},
        directory=args.results_dir,
    )


if __name__ == "__main__":
    main()
