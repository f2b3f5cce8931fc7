"""``make demo-ehr``: IGAMT with DP on the embedded synthetic EHR set, then synthesis and the thesis's evaluation.

Trains ``configs/igamt/synthetic.yaml`` through the same code path as ``dprobust fit``, shortened so that it runs in a
few minutes on a laptop CPU (1000 records of 12 steps, 3 epochs, DP at sigma 1.0 with strict_dp), synthesizes as many
records as the test split holds from the released artifact alone, and prints epsilon and the similarity numbers of
Tang 2021 (thesis section 4.3): overall and per-feature (#0, #4, #7) k-means cluster similarity, Minkowski (p = 2,
lower is closer) and cosine (higher is closer), against the real test records; the PCA, trajectory, missing-value and
time-increment pictures are written as PNG (and logged to the W&B run).

Usage: ``python -m lightning_dprobust.demo_ehr [--out runs/demo-ehr] [--max-epochs 3] [--noise-multiplier 1.0]``.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Mapping
from pathlib import Path

from lightning_dprobust.metrics.synthetic import DEFAULT_FEATURES
from lightning_dprobust.metrics.synthetic_eval import evaluate_generator
from lightning_dprobust.metrics.synthetic_plots import log_synthetic_evaluation, write_synthetic_plots
from lightning_dprobust.recipes import CONFIG_DIR, fit_recipe

SMALL_DATA = {"num_records": 1000, "num_steps": 12, "val_fraction": 0.05, "test_fraction": 0.2, "batch_size": 64}
"""The shortened data of the demo and of ``benchmarks/ehr_similarity.py``: 750 training records of 12 steps."""


def small_overrides(out: Path, max_epochs: int, noise_multiplier: float | None) -> list[str]:
    """``dprobust fit`` overrides that shorten ``configs/igamt/synthetic.yaml`` to :data:`SMALL_DATA`."""
    overrides = [f"--data.init_args.{key}={value}" for key, value in SMALL_DATA.items()]
    return [
        *overrides,
        f"--model.init_args.max_steps={SMALL_DATA['num_steps']}",
        f"--model.init_args.noise_multiplier={'null' if noise_multiplier is None else noise_multiplier}",
        f"--trainer.max_epochs={max_epochs}",
        f"--trainer.default_root_dir={out}",
        f"--trainer.logger.init_args.save_dir={out}",
    ]


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=str(CONFIG_DIR / "igamt" / "synthetic.yaml"))
    parser.add_argument("--out", default="runs/demo-ehr", help="parent of the run folder (checkpoint, logs, plots)")
    parser.add_argument("--max-epochs", type=int, default=3)
    parser.add_argument("--noise-multiplier", type=float, default=1.0)
    args = parser.parse_args(argv)
    out = Path(args.out) / time.strftime("%Y%m%d-%H%M%S")  # a fresh run folder each time: a folder holds one run
    start = time.perf_counter()
    fitted = fit_recipe(args.config, small_overrides(out, args.max_epochs, args.noise_multiplier), test=False)
    trained = time.perf_counter() - start
    real = fitted.datamodule.test_set.tensors
    report, synthetic = evaluate_generator(fitted.module.release(), real)
    names = [fitted.datamodule.schema.feature_names[f] for f in DEFAULT_FEATURES]
    images = write_synthetic_plots(real, synthetic, out / "plots", feature_names=names)
    log_synthetic_evaluation(fitted.trainer.loggers, report, images)
    _print_summary(fitted.module, report, names, images, trained, time.perf_counter() - start)
    return report


def _print_summary(module, report: Mapping[str, float], names, images, trained: float, total: float) -> None:
    print("\n== lightning-dprobust demo: IGAMT with DP on the synthetic EHR set, synthesis and similarity ==")
    print(f"privacy:      {module.privacy_summary()}")
    print(f"overall:      Minkowski {report['synthetic/minkowski']:.4f} (lower is closer), cosine "
          f"{report['synthetic/cosine']:.4f} (higher is closer), 3 k-means clusters, real test split")  # fmt: skip
    for feature, name in zip(DEFAULT_FEATURES, names, strict=True):
        print(f"#{feature} {name + ':':<16}Minkowski {report[f'synthetic/feature_{feature}/minkowski']:.4f}, "
              f"cosine {report[f'synthetic/feature_{feature}/cosine']:.4f}")  # fmt: skip
    print(f"time:         {trained:.0f} s training, {total - trained:.0f} s synthesis and evaluation")
    for name, path in images.items():
        print(f"{name + ':':<19} {path}")


if __name__ == "__main__":
    main()
