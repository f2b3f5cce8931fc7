"""StoBatch against DP-SGD and DP-Adv at the same epsilon on digits: accuracy under I-FGSM, MIM and PGD.

For each seed (``--seeds``, default 0 1 2: model initialization and attack starts, see ``benchmarks/seeds.py``;
StoBatch's noise and batches are secret, so they differ in every run) trains ``configs/stobatch/digits.yaml`` and the
DP-SGD and DP-Adv digits recipes with ``dp.target_epsilon`` set to ``--epsilon`` (default 2; StoBatch's epsilon is
pure DP, delta 0, the others' at delta 1e-5), then attacks each on the test split with BIM (I-FGSM), MIFGSM (MIM)
and PGD, l_inf, 10 steps, at each ``--eps`` (pixel units; 0.1 and 0.2 are 0.2 and 0.4 in the paper's [-1, 1] scale).
StoBatch is attacked and evaluated as released (``inference_noise="released"``: no offset for the secret training
draw of its noise, the first normalization on the batch's statistics). Prints a markdown table of mean +- sample
standard deviation over the seeds. Usage:
``python benchmarks/stobatch_digits.py [--seeds 0 1 2] [--epsilon 2] [--eps 0.1 0.2]``.
"""

from __future__ import annotations

import argparse
import logging
import tempfile
import warnings

from seeds import Sweep, add_seed_arguments, run_or_load, seeded_config

from lightning_dprobust.recipes import CONFIG_DIR, fit_recipe
from lightning_dprobust.robustness.attacks import build_attack, robust_accuracy
from lightning_dprobust.robustness.reports import markdown_table

METHODS = {"stobatch": "StoBatch", "dpsgd": "DP-SGD", "dpadv": "DP-Adv (PGD-Linf 0.1)"}
ATTACKS = {"I-FGSM": "BIM", "MIM": "MIFGSM", "PGD": "PGD"}


def evaluate(method: str, seed: int, args: argparse.Namespace, root: str) -> dict[str, float]:
    """Train ``method``'s digits recipe at ``args.epsilon`` with ``seed``; its epsilon, clean and attacked accuracy."""
    overrides = [
        "--trainer.logger=false",
        "--trainer.enable_progress_bar=false",
        "--trainer.enable_model_summary=false",
        f"--trainer.default_root_dir={root}/{method}-{seed}",
        f"--model.init_args.epsilon={args.epsilon}" if method == "stobatch" else f"--dp.target_epsilon={args.epsilon}",
    ]
    fitted = fit_recipe(seeded_config(CONFIG_DIR / method / "digits.yaml", seed), overrides)
    module, test_set = fitted.module.eval(), fitted.datamodule.test_set
    epsilon = fitted.module.ledger.epsilon(0.0) if method == "stobatch" else fitted.privacy.epsilon()
    metrics = {"epsilon": epsilon, "clean": fitted.test["test/acc"]}
    for eps in args.eps:
        suite = {label: build_attack(name, module, eps, steps=10) for label, name in ATTACKS.items()}
        accuracies = robust_accuracy(module, test_set.tensors, suite, seed=seed)
        metrics |= {f"{label}@{eps:g}": accuracies[label] for label in ATTACKS}
    return metrics


def run_seed(seed: int, args: argparse.Namespace, root: str) -> dict[str, float]:
    metrics = {}
    for method in METHODS:
        metrics |= {f"{method}/{key}": value for key, value in evaluate(method, seed, args, root).items()}
    return metrics


def table(result: Sweep, args: argparse.Namespace) -> str:
    columns = [(label, eps) for eps in args.eps for label in ATTACKS]
    header = ["method", "epsilon", "clean acc (%)", *(f"{label} {eps:g} (%)" for label, eps in columns)]
    rows = [
        [
            name,
            result.cell(f"{method}/epsilon", digits=3),
            result.cell(f"{method}/clean", 100),
            *(result.cell(f"{method}/{label}@{eps:g}", 100) for label, eps in columns),
        ]
        for method, name in METHODS.items()
    ]
    return markdown_table(header, rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epsilon", type=float, default=2.0, help="privacy budget of every method (default: 2)")
    parser.add_argument("--eps", type=float, nargs="+", default=[0.1, 0.2], help="l_inf attack sizes, pixel units")
    add_seed_arguments(parser)
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    with tempfile.TemporaryDirectory() as root:
        result = run_or_load(lambda seed: run_seed(seed, args, root), args, label="stobatch-digits")
    print(f"\nAccuracy under l_inf attacks (10 steps) on the digits test split; {result.note()}\n")
    print(table(result, args))


if __name__ == "__main__":
    main()
