"""Run a recipe over seeds and report every number as mean +- standard deviation with its seed list.

A comparison of methods is only as good as its spread: one seed can be the best of ten. :func:`sweep` calls a
function once per seed and collects the metrics it returns; :class:`Sweep` formats each metric as ``mean +- std``
(sample standard deviation, ``ddof = 1``) and names the seeds. :func:`seeded_config` is the one place where a seed
enters a recipe: it sets ``seed_everything`` (model initialization and every other draw from the global RNG)
and the ``DPCallback``'s ``seed`` (the Poisson sampling and noise of its explicit, reproducible mode). The data
split (``data.init_args.seed``) stays as the recipe sets it, so every seed is evaluated on the same test split.

Usage from a benchmark::

    sweep_result = sweep(lambda seed: {"acc": train_and_test(seeded_config(config, seed))}, seeds=(0, 1, 2))
    sweep_result.cell("acc", scale=100)  # '92.86 +- 1.16'
"""

from __future__ import annotations

import argparse
import copy
import json
import logging
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml

DEFAULT_SEEDS = (0, 1, 2)


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (``ddof = 1``; ``nan`` for a single value): the one place in the benchmarks
    where a spread is computed (``tests/test_benchmark_seeds.py`` greps for any other)."""
    array = np.asarray(values, dtype=float)
    return float(array.mean()), float(array.std(ddof=1)) if len(array) > 1 else float("nan")


def spread_cell(values: Sequence[float], scale: float = 1.0, digits: int = 2) -> str:
    """``'mean +- std'`` (sample std) of ``values`` times ``scale``; a single value gives ``'value (1 seed)'``. A
    value that is not finite has no spread: the same one in every seed is printed alone (``'inf'``: no DP guarantee),
    a mix says how many seeds were not finite."""
    infinite = [value for value in values if not np.isfinite(value)]
    if infinite and len(set(infinite)) == 1 and len(infinite) == len(values):
        return f"{scale * infinite[0]}"
    if infinite:
        return f"not finite in {len(infinite)} of {len(values)} seeds"
    mean, std = mean_std(values)
    if len(values) == 1:
        return f"{scale * mean:.{digits}f} (1 seed)"
    return f"{scale * mean:.{digits}f} +- {scale * std:.{digits}f}"


def quiet_training() -> None:
    """Warnings off and Lightning's logs at ERROR level: a benchmark prints its own tables."""
    warnings.filterwarnings("ignore")
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)


def add_seed_arguments(parser: argparse.ArgumentParser, default: Sequence[int] = DEFAULT_SEEDS) -> None:
    """Add ``--seeds S [S ...]`` (default ``0 1 2``), ``--save-runs FILE`` and ``--from-runs FILE [FILE ...]``.

    Seeds can run in separate processes (``--seeds 0 --save-runs s0.json``, ...) and be aggregated afterwards
    with ``--from-runs s0.json s1.json ...``, which trains nothing.
    """
    parser.add_argument(
        "--seeds", type=int, nargs="+", default=list(default), help=f"seeds to run (default: {list(default)})"
    )
    parser.add_argument("--save-runs", default=None, help="write the per-seed metrics to this JSON file")
    parser.add_argument("--from-runs", nargs="+", default=None, help="aggregate saved per-seed metrics; train nothing")


def run_or_load(run: Callable[[int], Mapping[str, float]], args: argparse.Namespace, label: str = "") -> Sweep:
    """The sweep the arguments of :func:`add_seed_arguments` ask for: merged from files, or run (and saved)."""
    if args.from_runs:
        return Sweep.merge(args.from_runs)
    result = sweep(run, args.seeds, label)
    if args.save_runs:
        result.save(args.save_runs)
    return result


def seeded_config(config: str | Path | Mapping[str, Any], seed: int) -> dict[str, Any]:
    """A copy of a recipe (YAML path or parsed dict) with ``seed_everything`` and the ``dp`` group's ``seed`` set.

    Raises:
        FileNotFoundError: if ``config`` is a path that does not exist.
    """
    if isinstance(config, str | Path):
        config = yaml.safe_load(Path(config).read_text())
    seeded = copy.deepcopy(dict(config))
    seeded["seed_everything"] = int(seed)
    dp = seeded.get("dp")
    if dp is not None:  # the `dp` group: plain arguments, or class_path + init_args for a DPCallback subclass
        seeded["dp"] = copy.deepcopy(dict(dp))
        arguments = seeded["dp"].setdefault("init_args", {}) if "class_path" in dp else seeded["dp"]
        arguments["seed"] = int(seed)
    return seeded


@dataclass
class Sweep:
    """The metrics of one run per seed, in seed order."""

    seeds: list[int] = field(default_factory=list)
    runs: list[dict[str, float]] = field(default_factory=list)

    def values(self, key: str) -> np.ndarray:
        """The metric ``key`` of every run; raises ``KeyError`` naming the recorded metrics if a run lacks it."""
        missing = [seed for seed, run in zip(self.seeds, self.runs, strict=True) if key not in run]
        if missing:
            raise KeyError(f"metric {key!r} missing for seeds {missing}; recorded: {sorted(self.runs[0])}")
        return np.array([run[key] for run in self.runs], dtype=float)

    def mean_std(self, key: str) -> tuple[float, float]:
        """Mean and sample standard deviation (``ddof = 1``; ``nan`` for a single seed) of ``key``."""
        return mean_std(self.values(key))

    def cell(self, key: str, scale: float = 1.0, digits: int = 2) -> str:
        """``'mean +- std'`` of ``key`` times ``scale``; a single seed gives ``'value (1 seed)'``."""
        return spread_cell(self.values(key), scale, digits)

    def save(self, path: str | Path) -> None:
        """Write the seeds and their metrics as JSON, so runs done in separate processes can be merged."""
        Path(path).write_text(json.dumps({"seeds": self.seeds, "runs": self.runs}, indent=1))

    @classmethod
    def merge(cls, paths: Sequence[str | Path]) -> Sweep:
        """The sweeps saved in ``paths`` as one, in seed order; raises ``ValueError`` if a seed appears twice."""
        pairs = []
        for path in paths:
            data = json.loads(Path(path).read_text())
            pairs += list(zip(data["seeds"], data["runs"], strict=True))
        seeds = [seed for seed, _ in pairs]
        if len(set(seeds)) != len(seeds):
            raise ValueError(f"the saved sweeps {list(map(str, paths))} repeat a seed: {sorted(seeds)}")
        pairs.sort(key=lambda pair: pair[0])
        return cls(seeds=[seed for seed, _ in pairs], runs=[run for _, run in pairs])

    def note(self) -> str:
        """The sentence that goes under a table: how many seeds, which ones, what the spread is."""
        seeds = ", ".join(str(seed) for seed in self.seeds)
        if len(self.seeds) == 1:
            return f"single run (seed {seeds})"
        return f"mean +- sample standard deviation over {len(self.seeds)} seeds ({seeds})"


def sweep(run: Callable[[int], Mapping[str, float]], seeds: Sequence[int], label: str = "") -> Sweep:
    """Call ``run(seed)`` for each seed (in order) and collect the metrics it returns.

    Raises:
        ValueError: if ``seeds`` is empty or repeats a seed.
    """
    if not seeds or len(set(seeds)) != len(seeds):
        raise ValueError(f"seeds must be distinct and at least one, got {list(seeds)}: pass e.g. --seeds 0 1 2")
    result = Sweep()
    for seed in seeds:
        start = time.perf_counter()
        metrics = {key: float(value) for key, value in run(int(seed)).items()}
        result.seeds.append(int(seed))
        result.runs.append(metrics)
        shown = ", ".join(f"{key}={value:.4g}" for key, value in metrics.items())
        print(f"[{label or 'run'} seed {seed}: {time.perf_counter() - start:.0f} s] {shown}", flush=True)
    return result
