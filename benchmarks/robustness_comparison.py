"""DP-CERT vs DP-SGD + smoothing, and DP-Adv vs DP-SGD and non-private adversarial training, over several seeds.

For each seed (``--seeds``, default 0 1 2: model initialization and DP sampling, see ``benchmarks/seeds.py``; the
data split stays the recipe's) trains the recipes ``configs/{dpsgd,dpcert,dpadv}/<dataset>.yaml`` (digits: epsilon 3,
delta 1e-5) and the variants ``--methods`` asks for (default: all of :data:`CERTIFIED` and :data:`ATTACKED`), then

* certifies DP-SGD and each DP-CERT variant on the test split with randomized smoothing at ``--sigma`` with the same
  settings (``--n0``, ``--n``, ``--alpha``, ``--skip``; the certification generator is seeded with the run's seed);
  the variants are those of the DP-CERT paper's Table 1 and Fig. 3 ablations (``methods/dpcert.py``);
* attacks DP-SGD, DP-Adv and the DP-Adv recipe trained without DP (``advtrain``: the baseline the DP-Adv paper
  compares with) with PGD-Linf at ``--eps`` (20 steps; the random start is seeded with the run's seed).

Prints both comparisons as markdown tables of mean +- sample standard deviation over the seeds, and the paired
difference of certified accuracy (DP-CERT minus DP-SGD, same seed). Usage:
``python benchmarks/robustness_comparison.py [--seeds 0 1 2] [--dataset digits] [--n 10000] [--methods ...]``.
"""

from __future__ import annotations

import argparse
import tempfile

import yaml
from seeds import Sweep, add_seed_arguments, quiet_training, run_or_load, seeded_config

from lightning_dprobust.recipes import CONFIG_DIR, fit_recipe
from lightning_dprobust.robustness.attacks import build_attack, robust_accuracy
from lightning_dprobust.robustness.certify import certify_dataset, summarize
from lightning_dprobust.robustness.reports import markdown_table
from results import add_results_arguments, result_name, write_result

RADII = (0.0, 0.25, 0.5, 0.75)
CERTIFIED = {
    "dpsgd": "DP-SGD + smoothing",
    "dpcert": "DP-CERT (gaussian)",
    "dpcert_stability": "DP-CERT + stability",
    "dpcert_macer": "DP-CERT + MACER",
    "dpcert_consistency": "DP-CERT + consistency",
    "dpcert_smoothadv": "DP-CERT (SmoothAdv views)",
    "dpcert_psac": "DP-CERT (gaussian, PSAC clipping)",
}
ATTACKED = {"dpsgd": "DP-SGD", "dpadv": "DP-Adv (PGD-Linf 0.1)", "advtrain": "adversarial training, no DP"}
RECIPES = {  # method -> (recipe folder, overrides, private)
    "dpsgd": ("dpsgd", [], True),
    "dpcert": ("dpcert", [], True),
    "dpcert_stability": ("dpcert", ["--model.init_args.regularizer=stability"], True),
    "dpcert_macer": ("dpcert", ["--model.init_args.regularizer=macer"], True),
    "dpcert_consistency": ("dpcert", ["--model.init_args.regularizer=consistency"], True),
    "dpcert_smoothadv": ("dpcert", ["--model.init_args.augmentation=smoothadv"], True),
    "dpcert_psac": ("dpcert", ["--dp.clipping=psac"], True),
    "dpadv": ("dpadv", [], True),
    "advtrain": ("dpadv", [], False),
}


def evaluate(method: str, seed: int, args: argparse.Namespace, root: str) -> dict[str, float]:
    """Train ``method``'s recipe with ``seed``; its epsilon (inf without DP), clean accuracy, certificates and/or PGD
    accuracy."""
    folder, overrides, private = RECIPES[method]
    quiet = [
        "--trainer.logger=false",
        "--trainer.enable_progress_bar=false",
        "--trainer.enable_model_summary=false",
        f"--trainer.default_root_dir={root}/{method}-{seed}",
        *overrides,
    ]
    config = yaml.safe_load((CONFIG_DIR / folder / f"{args.dataset}.yaml").read_text())
    if not private:
        config["dp"] = None
    fitted = fit_recipe(seeded_config(config, seed), quiet)
    module, test_set = fitted.module.eval(), fitted.datamodule.test_set
    epsilon = fitted.privacy.epsilon() if fitted.privacy is not None else float("inf")
    metrics = {"epsilon": epsilon, "clean": fitted.test["test/acc"]}
    if method in CERTIFIED:
        settings = dict(sigma=args.sigma, n0=args.n0, n=args.n, alpha=args.alpha, skip=args.skip)
        rows = certify_dataset(module, test_set, batch_size=1000, seed=seed, progress=False, **settings)
        metrics |= {key: value for key, value in summarize(rows, RADII).items() if key != "num_examples"}
    if method in ATTACKED:
        attack = {"PGD": build_attack("PGD", module, args.eps, steps=20)}
        metrics["pgd"] = robust_accuracy(module, test_set.tensors, attack, seed=seed)["PGD"]  # seed: random start
    return metrics


def run_seed(seed: int, args: argparse.Namespace, root: str) -> dict[str, float]:
    """The methods at one seed, metrics keyed ``<method>/<metric>``, plus the paired certified-accuracy gaps."""
    metrics = {}
    for method in args.methods:
        metrics |= {f"{method}/{key}": value for key, value in evaluate(method, seed, args, root).items()}
    if {"dpsgd", "dpcert"} <= set(args.methods):
        for radius in RADII:
            key = f"certified_acc@{radius:g}"
            metrics[f"gap/{key}"] = metrics[f"dpcert/{key}"] - metrics[f"dpsgd/{key}"]
    return metrics


def epsilon_cell(result: Sweep, method: str) -> str:
    """``mean +- std`` of the method's epsilon, or ``inf (no DP)`` for a non-private baseline."""
    if all(value == float("inf") for value in result.values(f"{method}/epsilon")):
        return "inf (no DP)"
    return result.cell(f"{method}/epsilon", digits=3)


def certified_cells(result: Sweep, args: argparse.Namespace) -> tuple[list[str], list[list[str]]]:
    header = ["method", "epsilon", "clean acc (%)", *(f"cert. acc r={r:g} (%)" for r in RADII), "ACR"]
    return header, [
        [
            label,
            epsilon_cell(result, method),
            result.cell(f"{method}/clean", 100),
            *(result.cell(f"{method}/certified_acc@{r:g}", 100) for r in RADII),
            result.cell(f"{method}/acr", digits=4),
        ]
        for method, label in CERTIFIED.items()
        if method in args.methods
    ]


def gap_note(result: Sweep, args: argparse.Namespace) -> str:
    """The paired DP-CERT minus DP-SGD certified-accuracy sentence, or ``''`` if either was not run."""
    if not {"dpsgd", "dpcert"} <= set(args.methods):
        return ""
    gap = result.values("gap/certified_acc@0.25")
    return (
        f"DP-CERT minus DP-SGD (paired by seed), certified accuracy at r = 0.25: "
        f"{result.cell('gap/certified_acc@0.25', 100)} points; DP-CERT ahead in {(gap > 0).sum()}/{len(gap)} seeds."
    )


def certified_table(result: Sweep, args: argparse.Namespace) -> str:
    table, gap = markdown_table(*certified_cells(result, args)), gap_note(result, args)
    return f"{table}\n\n{gap}" if gap else table


def attack_cells(result: Sweep, args: argparse.Namespace) -> tuple[list[str], list[list[str]]]:
    header = ["method", "epsilon", "clean acc (%)", f"PGD acc eps={args.eps:g} (%)"]
    return header, [
        [
            label,
            epsilon_cell(result, method),
            result.cell(f"{method}/clean", 100),
            result.cell(f"{method}/pgd", 100),
        ]
        for method, label in ATTACKED.items()
        if method in args.methods
    ]


def attack_table(result: Sweep, args: argparse.Namespace) -> str:
    return markdown_table(*attack_cells(result, args))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default="digits", help="configs/<method>/<dataset>.yaml (default: digits)")
    parser.add_argument("--n0", type=int, default=100)
    parser.add_argument("--n", type=int, default=10_000)
    parser.add_argument("--alpha", type=float, default=0.001)
    parser.add_argument("--skip", type=int, default=1, help="certify every skip-th test example (default: 1)")
    parser.add_argument("--sigma", type=float, default=0.25)
    parser.add_argument("--eps", type=float, default=0.1, help="PGD-Linf budget for the DP-Adv comparison")
    parser.add_argument("--methods", nargs="+", default=list(RECIPES), choices=list(RECIPES))
    add_seed_arguments(parser)
    add_results_arguments(parser)
    args = parser.parse_args()
    quiet_training()
    with tempfile.TemporaryDirectory() as root:
        result = run_or_load(lambda seed: run_seed(seed, args, root), args, label=args.dataset)
    certified = f"sigma={args.sigma}, n0={args.n0}, n={args.n}, alpha={args.alpha}, skip={args.skip}"
    attacked = f"PGD-Linf eps={args.eps}, 20 steps"
    print(f"\nCertified robustness on {args.dataset} test split, {certified}; {result.note()}\n")
    print(certified_table(result, args))
    print(f"\nEmpirical robustness on {args.dataset} test split, {attacked}; {result.note()}\n")
    print(attack_table(result, args))
    name = result_name(args, f"robustness_comparison_{args.dataset}")
    tables = {
        "certified": ("Certified robustness", certified_cells, f"{certified}. {gap_note(result, args)}".strip()),
        "attacked": ("Empirical robustness", attack_cells, attacked),
    }
    for suffix, (title, build, settings) in tables.items():
        header, rows = build(result, args)
        if rows:
            write_result(
                f"{name}_{suffix}",
                title=f"{title} on the {args.dataset} test split",
                columns=header,
                rows=rows,
                seeds=result.seeds,
                notes=f"{result.note()}; {settings}",
                raw={"runs": result.runs},
                directory=args.results_dir,
            )


if __name__ == "__main__":
    main()
