"""StoBatch against DP-SGD and DP-Adv at the same epsilon on digits: accuracy under I-FGSM, MIM and PGD.

For each seed (``--seeds``, default 0 1 2: model initialization and attack starts, see ``benchmarks/seeds.py``;
StoBatch's noise and batches are secret, so they differ in every run) trains ``configs/stobatch/digits.yaml`` and the
DP-SGD and DP-Adv digits recipes with ``dp.target_epsilon`` set to ``--epsilon`` (default 2; StoBatch's epsilon is
nominal, no differential-privacy guarantee, shown as "2 (nominal)"; the others' are guarantees at delta 1e-5), then
attacks each on the test split with BIM (I-FGSM), MIFGSM (MIM)
and PGD, l_inf, 10 steps, at each ``--eps`` (pixel units; 0.1 and 0.2 are 0.2 and 0.4 in the paper's [-1, 1] scale).
StoBatch is attacked and evaluated as released (``inference_noise="released"``: no offset for the secret training draw
of its noise; the config's per-example network, ``normalization: none``). StoBatch is also certified on the clean test
split by PixelDP verified inference (Phan et al. 2020, Alg. 3: ``--n`` draws, eta 0.05, Clopper-Pearson), under the
``paper`` and the ``strict`` condition: certified accuracy (correct and radius ``>= mu_a``) at each ``--eps`` and the
mean certified radius; DP-SGD and DP-Adv inject no inference noise, so they have no PixelDP certificate ("-").
Prints a markdown table of mean +- sample standard deviation over the seeds. Usage:
``python benchmarks/stobatch_digits.py [--seeds 0 1 2] [--epsilon 2] [--eps 0.1 0.2] [--n 2000]``.
"""

from __future__ import annotations

import argparse
import tempfile

from seeds import Sweep, add_seed_arguments, quiet_training, run_or_load, seeded_config
from torch import Tensor

from lightning_dprobust.recipes import CONFIG_DIR, fit_recipe
from lightning_dprobust.robustness.attacks import build_attack, robust_accuracy
from lightning_dprobust.robustness.pixeldp import PixelDPMechanism, certify_pixeldp, pixeldp_metrics
from lightning_dprobust.robustness.reports import markdown_table
from results import add_results_arguments, result_name, write_result

METHODS = {"stobatch": "StoBatch", "dpsgd": "DP-SGD", "dpadv": "DP-Adv (PGD-Linf 0.1)"}
ATTACKS = {"I-FGSM": "BIM", "MIM": "MIFGSM", "PGD": "PGD"}
CONDITIONS = ("paper", "strict")


def evaluate(method: str, seed: int, args: argparse.Namespace, root: str) -> dict[str, float]:
    """Train ``method``'s digits recipe at ``args.epsilon`` with ``seed``; its epsilon, clean and attacked accuracy,
    and for StoBatch its PixelDP certificates (:func:`certified`)."""
    overrides = [
        "--trainer.logger=false",
        "--trainer.enable_progress_bar=false",
        "--trainer.enable_model_summary=false",
        f"--trainer.default_root_dir={root}/{method}-{seed}",
        f"--model.init_args.epsilon={args.epsilon}" if method == "stobatch" else f"--dp.target_epsilon={args.epsilon}",
    ]
    fitted = fit_recipe(seeded_config(CONFIG_DIR / method / "digits.yaml", seed), overrides)
    module, test_set = fitted.module.eval(), fitted.datamodule.test_set
    epsilon = fitted.module.ledger.nominal[0].epsilon if method == "stobatch" else fitted.privacy.epsilon()
    metrics = {"epsilon": epsilon, "clean": fitted.test["test/acc"]}
    for eps in args.eps:
        suite = {label: build_attack(name, module, eps, steps=10) for label, name in ATTACKS.items()}
        accuracies = robust_accuracy(module, test_set.tensors, suite, seed=seed)
        metrics |= {f"{label}@{eps:g}": accuracies[label] for label in ATTACKS}
    return metrics | (certified(module, test_set.tensors, seed, args) if method == "stobatch" else {})


def certified(
    module: PixelDPMechanism, data: tuple[Tensor, Tensor], seed: int, args: argparse.Namespace
) -> dict[str, float]:
    """PixelDP certified accuracy at each ``args.eps`` and mean radius of ``module`` on ``data``, per condition.

    Both conditions use the same ``args.n`` draws (same ``seed``); ``strict`` divides the radius by the module's
    ``psi`` and spends eta over twice as many Bonferroni hypotheses (see :mod:`lightning_dprobust.core.pixeldp`).
    """
    x, y = data
    metrics = {"radius_scale": module.pixeldp_radius_scale()}
    for condition in CONDITIONS:
        cert = certify_pixeldp(module, x, y, n=args.n, eta=0.05, condition=condition, psi=module.hparams.psi, seed=seed)
        accuracies = pixeldp_metrics(cert, y, mu_a=args.eps)
        metrics |= {f"cert_{condition}@{eps:g}": accuracies[f"certified_acc@{eps:g}"] for eps in args.eps}
        metrics[f"radius_{condition}"] = float(cert.radius.mean())
    return metrics


def run_seed(seed: int, args: argparse.Namespace, root: str) -> dict[str, float]:
    metrics = {}
    for method in METHODS:
        metrics |= {f"{method}/{key}": value for key, value in evaluate(method, seed, args, root).items()}
    return metrics


def table(result: Sweep, args: argparse.Namespace) -> str:
    return markdown_table(*table_cells(result, args))


def table_cells(result: Sweep, args: argparse.Namespace) -> tuple[list[str], list[list[str]]]:
    columns = [(label, eps) for eps in args.eps for label in ATTACKS]
    certified_columns = [(condition, eps) for eps in args.eps for condition in CONDITIONS]
    header = [
        "method",
        "epsilon",
        "clean acc (%)",
        *(f"{label} {eps:g} (%)" for label, eps in columns),
        *(f"certified {eps:g}, {condition} (%)" for condition, eps in certified_columns),
        *(f"mean radius, {condition}" for condition in CONDITIONS),
    ]
    rows = []
    for method, name in METHODS.items():
        certified_cells = [
            *(_cell(result, f"{method}/cert_{condition}@{eps:g}", 100) for condition, eps in certified_columns),
            *(_cell(result, f"{method}/radius_{condition}", digits=4) for condition in CONDITIONS),
        ]
        conventional = [result.cell(f"{method}/{label}@{eps:g}", 100) for label, eps in columns]
        epsilon = result.cell(f"{method}/epsilon", digits=3) + (" (nominal)" if method == "stobatch" else "")
        rows.append([name, epsilon, result.cell(f"{method}/clean", 100), *conventional, *certified_cells])
    return header, rows


def _cell(result: Sweep, key: str, scale: float = 1.0, digits: int = 2) -> str:
    """``result.cell``, or ``"-"`` for a metric the method does not have (no PixelDP certificate)."""
    return result.cell(key, scale, digits) if key in result.runs[0] else "-"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epsilon", type=float, default=2.0, help="privacy budget of every method (default: 2)")
    parser.add_argument("--eps", type=float, nargs="+", default=[0.1, 0.2], help="l_inf attack sizes, pixel units")
    parser.add_argument("--n", type=int, default=2000, help="PixelDP draws per test example (default: 2000)")
    add_seed_arguments(parser)
    add_results_arguments(parser)
    args = parser.parse_args()
    if args.n < 1:
        parser.error(f"--n must be an integer >= 1 (PixelDP draws per example), got {args.n}")
    quiet_training()
    with tempfile.TemporaryDirectory() as root:
        result = run_or_load(lambda seed: run_seed(seed, args, root), args, label="stobatch-digits")
    print(f"\nAccuracy under l_inf attacks (10 steps) on the digits test split; {result.note()}\n")
    print(table(result, args))
    scales = ", ".join(f"{value:.4g}" for value in result.values("stobatch/radius_scale"))
    print(f"\nStoBatch pixeldp_radius_scale() per seed (l_inf radius per unit of epsilon_r): {scales}")
    header, rows = table_cells(result, args)
    write_result(
        result_name(args, "stobatch_digits"),
        title=f"StoBatch against DP baselines on digits at epsilon {args.epsilon:g}: accuracy under l_inf attacks",
        columns=header,
        rows=rows,
        seeds=result.seeds,
        notes=f"{result.note()}; attacks: 10 steps; PixelDP draws per example: {args.n}; StoBatch's "
        f"pixeldp_radius_scale() per seed: {scales}",
        raw={"runs": result.runs},
        directory=args.results_dir,
    )


if __name__ == "__main__":
    main()
