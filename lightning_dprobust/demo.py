"""``make demo``: DP-CERT on the embedded digits at epsilon 3, then randomized-smoothing certification.

Trains ``configs/dpcert/digits.yaml`` (DP-Gaussian, K = 2 views, sigma = 0.25, epsilon = 3, delta = 1e-5) through the
same code path as ``dprobust fit``, certifies every test image at the training sigma (Cohen et al. 2019), and prints
epsilon, clean accuracy, certified accuracy at radii 0 / 0.25 / 0.5 / 0.75 and the average certified radius, with
the paths of the CSV, markdown report and plot.

Usage: ``python -m lightning_dprobust.demo [--out runs/demo] [--n 10000] [--max-epochs N]``.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from lightning_dprobust.recipes import CONFIG_DIR, fit_recipe
from lightning_dprobust.robustness.certify import (
    certify_dataset,
    plot_certified_accuracy,
    summarize,
    write_csv,
    write_markdown,
)

RADII = (0.0, 0.25, 0.5, 0.75)


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=str(CONFIG_DIR / "dpcert" / "digits.yaml"))
    parser.add_argument("--out", default="runs/demo", help="parent of the run folder (checkpoint, logs and reports)")
    parser.add_argument("--n", type=int, default=10_000, help="noise draws per certified image")
    parser.add_argument("--max-epochs", type=int, default=None)
    args = parser.parse_args(argv)
    out = Path(args.out) / time.strftime("%Y%m%d-%H%M%S")  # a fresh run folder each time: a folder holds one run
    overrides = [f"--trainer.default_root_dir={out}", f"--trainer.logger.init_args.save_dir={out}"]
    if args.max_epochs:
        overrides.append(f"--trainer.max_epochs={args.max_epochs}")

    start = time.perf_counter()
    fitted = fit_recipe(args.config, overrides)
    trained = time.perf_counter() - start
    sigma = fitted.module.hparams.sigma
    rows = certify_dataset(
        fitted.module.eval(),
        fitted.datamodule.test_set,
        sigma=sigma,
        n0=100,
        n=args.n,
        alpha=0.001,
        batch_size=1000,
        seed=0,
        desc="certify test split",
    )
    summary = summarize(rows, RADII)
    paths = {
        "csv": write_csv(rows, out / "certify.csv"),
        "report": write_markdown(summary, out / "certify.md", label="DP-CERT digits"),
        "plot": plot_certified_accuracy({"DP-CERT digits": rows}, out / "certified_accuracy.png"),
    }
    _print_summary(fitted, summary, sigma, args.n, trained, time.perf_counter() - start, paths)
    return summary


def _print_summary(fitted, summary, sigma, n, trained, total, paths) -> None:
    privacy = fitted.privacy
    print("\n== lightning-dprobust demo: DP-CERT (gaussian) on digits, then certification ==")
    print(f"privacy:            epsilon = {privacy.epsilon():.3f} at delta = {privacy.delta:g} ({privacy.accountant})")
    print(f"clean accuracy:     {100 * fitted.test['test/acc']:.2f} % ({summary['num_examples']:.0f} test images)")
    print(f"certified accuracy (sigma = {sigma}, n = {n}, alpha = 0.001):")
    for radius in RADII:
        print(f"  radius {radius:<4g}        {100 * summary[f'certified_acc@{radius:g}']:.2f} %")
    print(f"average cert. radius {summary['acr']:.4f}")
    print(f"time:               {trained:.0f} s training, {total - trained:.0f} s evaluation")
    print(f"checkpoint:         {fitted.trainer.checkpoint_callback.last_model_path}")
    for name, path in paths.items():
        print(f"{name + ':':<19} {path}")


if __name__ == "__main__":
    main()
