"""``make demo``: DP-SGD on the embedded digits at epsilon 3 from the shipped config, then evaluation.

Runs the same code path as ``dprobust fit --config configs/dpsgd/digits.yaml`` and prints epsilon and test
accuracy. Usage: ``python -m lightning_dprobust.demo [--config PATH] [--max-epochs N]``.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from lightning_dprobust.callbacks import DPCallback
from lightning_dprobust.cli import DProbustCLI
from lightning_dprobust.data.base import ImageDataModule
from lightning_dprobust.methods.base import ClassifierModule

DEFAULT_CONFIG = Path(__file__).resolve().parents[1] / "configs" / "dpsgd" / "digits.yaml"


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=str(DEFAULT_CONFIG))
    parser.add_argument("--max-epochs", type=int, default=None)
    args = parser.parse_args(argv)
    overrides = ["--trainer.max_epochs", str(args.max_epochs)] if args.max_epochs else []
    cli = DProbustCLI(ClassifierModule, ImageDataModule, subclass_mode_model=True, subclass_mode_data=True,
                      args=["--config", args.config, *overrides], run=False, auto_configure_optimizers=False,
                      save_config_kwargs={"overwrite": True})
    start = time.perf_counter()
    cli.trainer.fit(cli.model, cli.datamodule)
    trained = time.perf_counter() - start
    test = cli.trainer.test(cli.model, cli.datamodule, verbose=False)[0]
    privacy = next((c for c in cli.trainer.callbacks if isinstance(c, DPCallback)), None)
    summary = {
        "epsilon": privacy.epsilon() if privacy else float("inf"),
        "delta": privacy.delta if privacy else None,
        "test_accuracy": test["test/acc"],
        "train_seconds": trained,
        "checkpoint": cli.trainer.checkpoint_callback.last_model_path if cli.trainer.checkpoint_callback else None,
    }
    print("\n== lightning-dprobust demo: DP-SGD on digits ==")
    print(f"privacy:        epsilon = {summary['epsilon']:.3f} at delta = {summary['delta']:g}")
    print(f"test accuracy:  {100 * summary['test_accuracy']:.2f} %")
    print(f"training time:  {trained:.1f} s")
    print(f"checkpoint:     {summary['checkpoint']}")
    return summary


if __name__ == "__main__":
    main()
