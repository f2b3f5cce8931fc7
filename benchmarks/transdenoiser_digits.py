"""TransDenoiser vs its ablations and DP classifiers + smoothing on digits at epsilon 1 (sigma 0.25, 3 seeds).

Rows, each trained from its shipped recipe with ``seed_everything`` and the Poisson sampler's seed set to the seed:

* ``transdenoiser``: ``configs/transdenoiser/digits.yaml`` (DnCNN-GN denoiser trained on the private half of the
  train split in front of ``mlp_tanh.erm_digits_public``, trained on the public half; xi_up 2.0; no DP guarantee,
  its epsilon of the noise added, at most 1, is nominal: the top-up's scale is chosen from the private batch);
* ``sepdp``: the same with ``TransDenoiserCallback(mode="sepdp")`` (plain gradient noise xi_up, (1, 1e-5)-DP);
* ``public classifier alone``: ``mlp_tanh.erm_digits_public`` smoothed with no denoiser and no private data (the
  baseline that could explain the denoisers' certificates away; epsilon 0: it reads no private example);
* ``nodp``: the same without the ``dp`` group (input perturbation only, not private);
* ``dpsgd+smoothing``: ``configs/dpsgd/digits.yaml`` at target_epsilon 1, certified with sigma 0.25;
* ``dpcert``: ``configs/dpcert/digits.yaml`` (Gaussian views, sigma 0.25) at target_epsilon 1.

Each model is certified on the 360 test images (Cohen et al.: n0 = 100, n = 10,000, alpha = 0.001, sigma 0.25).
Prints a markdown table of mean +- sample std over the seeds of the certified accuracy at r = 0, 0.25, 0.5, the ACR,
the DP epsilon (``inf`` without a guarantee) and the nominal epsilon of the noise added.

Usage: ``python benchmarks/transdenoiser_digits.py [--seeds 0 1 2] [--n 10000] [--out FILE]``.
"""

from __future__ import annotations

import argparse
import copy
import tempfile
import time
from pathlib import Path

import yaml
from seeds import spread_cell

from lightning_dprobust.recipes import CONFIG_DIR, fit_recipe
from lightning_dprobust.robustness.certify import certify_dataset, summarize
from results import add_results_arguments, result_name, write_result

RADII = (0.0, 0.25, 0.5)
SIGMA = 0.25
PUBLIC = "public classifier alone"
PUBLIC_CLASSIFIER = "mlp_tanh.erm_digits_public"


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
    rows = {"transdenoiser": trans, "sepdp": sep, "nodp": nodp, PUBLIC: {}}
    for name, path in (("dpsgd+smoothing", "dpsgd/digits.yaml"), ("dpcert", "dpcert/digits.yaml")):
        config = load(path)
        _dp_args(config)["target_epsilon"] = 1.0
        rows[name] = config
    return rows


def run(config: dict, seed: int, n: int) -> dict[str, float]:
    """Fit one recipe with ``seed`` (the public classifier's row: nothing to fit) and certify its test split; returns
    the certified metrics and the epsilons."""
    if not config:
        return public_classifier_alone(seed, n)
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
    metrics = certified(fitted.module.eval(), fitted.datamodule.test_set, n)
    privacy = fitted.privacy
    metrics["epsilon"] = float(privacy.epsilon()) if privacy is not None else float("inf")
    added = getattr(privacy, "added_noise_epsilon", None)  # TransDenoiser: the noise added, nominal in its top-up
    metrics["nominal_epsilon"] = float(added()) if added is not None else metrics["epsilon"]
    return metrics


def public_classifier_alone(seed: int, n: int) -> dict[str, float]:
    """The public classifier smoothed, with no denoiser: it reads no private example (epsilon 0)."""
    from lightning_dprobust.data import DigitsDataModule
    from lightning_dprobust.zoo import Zoo

    data = DigitsDataModule()
    data.setup("test")
    metrics = certified(Zoo().load(PUBLIC_CLASSIFIER), data.test_set, n, seed)
    return metrics | {"epsilon": 0.0, "nominal_epsilon": 0.0}


def certified(module, test_set, n: int, seed: int = 0) -> dict[str, float]:
    """Cohen et al.'s certification of ``test_set`` at :data:`SIGMA`: certified accuracy at :data:`RADII`, ACR."""
    rows = certify_dataset(
        module,
        test_set,
        sigma=SIGMA,
        n0=100,
        n=n,
        alpha=0.001,
        batch_size=1000,
        seed=seed,
        progress=False,
    )
    return {key: float(value) for key, value in summarize(rows, RADII).items() if key != "num_examples"}


KEYS = [f"certified_acc@{r:g}" for r in RADII] + ["acr", "epsilon", "nominal_epsilon"]


def table(results: dict[str, list[dict[str, float]]], seeds: list[int]) -> str:
    lines = [f"| method (seeds {', '.join(map(str, seeds))}) | " + " | ".join(KEYS) + " |"]
    lines.append("|" + "---|" * (len(KEYS) + 1))
    lines += ["| " + " | ".join(cells) + " |" for cells in table_cells(results)]
    return "\n".join(lines)


def table_cells(results: dict[str, list[dict[str, float]]]) -> list[list[str]]:
    return [
        [name, *(spread_cell([run[key] for run in runs], digits=3) for key in KEYS)] for name, runs in results.items()
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--n", type=int, default=10_000, help="Monte Carlo draws per certified example")
    parser.add_argument("--rows", nargs="+", default=None, help="only these rows")
    parser.add_argument("--out", type=Path, default=None, help="also write the table to this file")
    add_results_arguments(parser)
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
    write_result(
        result_name(args, "transdenoiser_digits"),
        title=f"TransDenoiser vs its ablations and DP classifiers + smoothing on digits (sigma {SIGMA})",
        columns=["method", *KEYS],
        rows=table_cells(results),
        seeds=args.seeds,
        notes=f"mean +- sample standard deviation over the seeds; certified on the test split with n0 = 100, n = "
        f"{args.n}, alpha = 0.001; epsilon: inf without a DP guarantee; nominal_epsilon: the noise added",
        raw=results,
        directory=args.results_dir,
    )


if __name__ == "__main__":
    main()
