"""TransDenoiser vs its ablations and DP classifiers + smoothing on digits at epsilon 1 (sigma 0.25, 3 seeds).

Rows, each trained from its shipped recipe with ``seed_everything`` and the Poisson sampler's seed set to the seed:

* ``transdenoiser``: ``configs/transdenoiser/digits.yaml`` (DnCNN-GN denoiser trained on the private half of the
  train split in front of ``mlp_tanh.erm_digits_public``, trained on the public half; xi_up 2.0, (1, 1e-5)-DP);
* ``sepdp``: the same with ``TransDenoiserCallback(mode="sepdp")`` (plain gradient noise xi_up);
* ``nodp``: the same without the ``dp`` group (input perturbation only, not private);
* ``dpsgd+smoothing``: ``configs/dpsgd/digits.yaml`` at target_epsilon 1, certified with sigma 0.25;
* ``dpcert``: ``configs/dpcert/digits.yaml`` (Gaussian views, sigma 0.25) at target_epsilon 1.

Each model is certified on the 360 test images (Cohen et al.: n0 = 100, n = 10,000, alpha = 0.001, sigma 0.25).
Prints a markdown table of mean +- std over the seeds of the certified accuracy at r = 0, 0.25, 0.5 and the ACR.

Usage: ``python benchmarks/transdenoiser_digits.py [--seeds 0 1 2] [--n 10000] [--out FILE]``.
"""

from __future__ import annotations

import argparse
import copy
import tempfile
import time
from pathlib import Path

import numpy as np
import yaml

from lightning_dprobust.recipes import CONFIG_DIR, fit_recipe
from lightning_dprobust.robustness.certify import certify_dataset, summarize

RADII = (0.0, 0.25, 0.5)
SIGMA = 0.25


def _dp_args(config: dict) -> dict:
    """The ``dp`` group's arguments, in place (``init_args`` when the group names its class)."""
    dp = config["dp"]
    return dp["init_args"] if "class_path" in dp else dp


def row_configs() -> dict[str, dict]:
    """The five recipes of the comparison."""
    load = lambda path: yaml.safe_load((CONFIG_DIR / path).read_text())  # noqa: E731
    trans = load("transdenoiser/digits.yaml")
    sep = copy.deepcopy(trans)
    _dp_args(sep)["mode"] = "sepdp"
    nodp = copy.deepcopy(trans)
    nodp["dp"] = None
    nodp["trainer"]["max_steps"] = 67  # as many steps as the private runs take within epsilon 1
    rows = {"transdenoiser": trans, "sepdp": sep, "nodp": nodp}
    for name, path in (("dpsgd+smoothing", "dpsgd/digits.yaml"), ("dpcert", "dpcert/digits.yaml")):
        config = load(path)
        _dp_args(config)["target_epsilon"] = 1.0
        rows[name] = config
    return rows


def run(config: dict, seed: int, n: int) -> dict[str, float]:
    """Fit one recipe with ``seed`` and certify its test split; returns the certified metrics and epsilon."""
    config = copy.deepcopy(config)
    config["seed_everything"] = seed
    if config.get("dp") is not None:
        _dp_args(config)["seed"] = seed
    with tempfile.TemporaryDirectory() as workdir:
        quiet = [
            "--trainer.logger=false",
            f"--trainer.default_root_dir={workdir}",
            "--trainer.enable_progress_bar=false",
        ]
        fitted = fit_recipe(config, quiet, test=False)
    module = fitted.module.eval()
    rows = certify_dataset(
        module,
        fitted.datamodule.test_set,
        sigma=SIGMA,
        n0=100,
        n=n,
        alpha=0.001,
        batch_size=1000,
        seed=0,
        progress=False,
    )
    metrics = {key: float(value) for key, value in summarize(rows, RADII).items() if key != "num_examples"}
    metrics["epsilon"] = float(fitted.privacy.epsilon()) if fitted.privacy is not None else float("inf")
    return metrics


def table(results: dict[str, list[dict[str, float]]], seeds: list[int]) -> str:
    keys = [f"certified_acc@{r:g}" for r in RADII] + ["acr", "epsilon"]
    lines = [f"| method (seeds {', '.join(map(str, seeds))}) | " + " | ".join(keys) + " |"]
    lines.append("|" + "---|" * (len(keys) + 1))
    for name, runs in results.items():
        cells = []
        for key in keys:
            values = np.array([run[key] for run in runs])
            cells.append(f"{values.mean():.3f} +- {values.std(ddof=1) if len(values) > 1 else 0.0:.3f}")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--n", type=int, default=10_000, help="Monte Carlo draws per certified example")
    parser.add_argument("--rows", nargs="+", default=None, help="only these rows")
    parser.add_argument("--out", type=Path, default=None, help="also write the table to this file")
    args = parser.parse_args()
    configs = row_configs()
    results: dict[str, list[dict[str, float]]] = {}
    for name in args.rows or list(configs):
        for seed in args.seeds:
            start = time.time()
            metrics = run(configs[name], seed, args.n)
            results.setdefault(name, []).append(metrics)
            print(f"{name} seed {seed}: {metrics} ({time.time() - start:.0f} s)", flush=True)
    text = table(results, args.seeds)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
