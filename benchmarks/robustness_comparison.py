"""DP-CERT vs DP-SGD + smoothing, and DP-Adv vs DP-SGD, on digits at the same privacy budget, in one run.

Trains the three shipped digits recipes (``configs/{dpsgd,dpcert,dpadv}/digits.yaml``: epsilon 3, delta 1e-5), then

* certifies DP-SGD and DP-CERT on the whole test split with randomized smoothing at the training sigma (0.25), with
  the same certification settings (``--n0``, ``--n``, ``--alpha``, one generator seeded with ``--seed``);
* attacks DP-SGD and DP-Adv with PGD-Linf at ``--eps`` (20 steps) on the whole test split.

Prints both comparisons as markdown tables. Usage: ``python benchmarks/robustness_comparison.py [--n 10000]``.
"""

from __future__ import annotations

import argparse
import logging
import tempfile
import warnings

from lightning_dprobust.recipes import CONFIG_DIR, fit_recipe
from lightning_dprobust.robustness.attacks import build_attack, robust_accuracy
from lightning_dprobust.robustness.certify import certify_dataset, summarize
from lightning_dprobust.robustness.reports import markdown_table

RADII = (0.0, 0.25, 0.5, 0.75)


def train(method: str, root: str):
    quiet = [
        "--trainer.logger=false",
        "--trainer.enable_progress_bar=false",
        "--trainer.enable_model_summary=false",
        f"--trainer.default_root_dir={root}/{method}",
    ]
    fitted = fit_recipe(CONFIG_DIR / method / "digits.yaml", quiet)
    return fitted.module.eval(), fitted


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n0", type=int, default=100)
    parser.add_argument("--n", type=int, default=10_000)
    parser.add_argument("--alpha", type=float, default=0.001)
    parser.add_argument("--sigma", type=float, default=0.25)
    parser.add_argument("--eps", type=float, default=0.1, help="PGD-Linf budget for the DP-Adv comparison")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)

    with tempfile.TemporaryDirectory() as root:
        models = {method: train(method, root) for method in ("dpsgd", "dpcert", "dpadv")}
    test_set = models["dpsgd"][1].datamodule.test_set

    rows = []
    for method, label in (("dpsgd", "DP-SGD + smoothing"), ("dpcert", "DP-CERT (gaussian)")):
        module, fitted = models[method]
        certified = certify_dataset(
            module,
            test_set,
            sigma=args.sigma,
            n0=args.n0,
            n=args.n,
            alpha=args.alpha,
            batch_size=1000,
            seed=args.seed,
            progress=False,
        )
        summary = summarize(certified, RADII)
        rows.append(
            [
                label,
                f"{fitted.privacy.epsilon():.3f}",
                f"{100 * fitted.test['test/acc']:.2f}",
                *(f"{100 * summary[f'certified_acc@{r:g}']:.2f}" for r in RADII),
                f"{summary['acr']:.4f}",
            ]
        )
    print(
        f"\nCertified robustness on digits ({len(test_set)} test images), sigma={args.sigma}, n0={args.n0}, "
        f"n={args.n}, alpha={args.alpha}\n"
    )
    print(
        markdown_table(["method", "epsilon", "clean acc (%)", *(f"cert. acc r={r:g} (%)" for r in RADII), "ACR"], rows)
    )

    images, labels = test_set.tensors
    rows = []
    for method, label in (("dpsgd", "DP-SGD"), ("dpadv", "DP-Adv (PGD-Linf 0.1)")):
        module, fitted = models[method]
        attack = {"PGD": build_attack("PGD", module, args.eps, steps=20)}
        accuracy = robust_accuracy(module, (images, labels), attack)
        rows.append(
            [label, f"{fitted.privacy.epsilon():.3f}", f"{100 * accuracy['clean']:.2f}", f"{100 * accuracy['PGD']:.2f}"]
        )
    print(f"\nEmpirical robustness on digits ({len(labels)} test images), PGD-Linf eps={args.eps}, 20 steps\n")
    print(markdown_table(["method", "epsilon", "clean acc (%)", f"PGD acc eps={args.eps:g} (%)"], rows))


if __name__ == "__main__":
    main()
