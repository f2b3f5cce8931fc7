"""Run a YAML recipe from Python exactly as ``dprobust fit --config`` would (demo, zoo builds, benchmarks)."""

from __future__ import annotations

import tempfile
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import lightning as L
import yaml

from lightning_dprobust.callbacks import DPCallback
from lightning_dprobust.cli import DProbustCLI
from lightning_dprobust.data.base import ImageDataModule
from lightning_dprobust.methods.base import ClassifierModule

CONFIG_DIR = Path(__file__).resolve().parents[1] / "configs"
"""The shipped recipes, ``configs/<method>/<dataset>.yaml``."""


@dataclass
class FittedRecipe:
    """What a fitted recipe produced: the trainer, module and data, its DP callback (if any) and test metrics."""

    trainer: L.Trainer
    module: ClassifierModule
    datamodule: ImageDataModule
    privacy: DPCallback | None
    test: dict[str, float] = field(default_factory=dict)


def build_recipe(config: str | Path | dict[str, Any], overrides: Sequence[str] = ()) -> DProbustCLI:
    """Parse and instantiate a recipe (a YAML path or a config dict) plus ``--key=value`` overrides, without fitting."""
    with tempfile.TemporaryDirectory() as scratch:
        if isinstance(config, dict):
            path = Path(scratch) / "recipe.yaml"
            path.write_text(yaml.safe_dump(config, sort_keys=False))
            config = path
        with warnings.catch_warnings():  # LightningCLI warns whenever args= is given while sys.argv has arguments
            warnings.filterwarnings("ignore", message="LightningCLI's args parameter")
            return DProbustCLI(args=["--config", str(config), *overrides], run=False)


def fit_recipe(config: str | Path | dict[str, Any], overrides: Sequence[str] = (), test: bool = True) -> FittedRecipe:
    """Fit a recipe and, with ``test=True``, evaluate it on the data module's test split."""
    cli = build_recipe(config, overrides)
    cli.trainer.fit(cli.model, cli.datamodule)
    metrics = cli.trainer.test(cli.model, cli.datamodule, verbose=False)[0] if test else {}
    return FittedRecipe(cli.trainer, cli.model, cli.datamodule, find_dp_callback(cli.trainer), metrics)


def find_dp_callback(trainer: L.Trainer) -> DPCallback | None:
    """The trainer's ``DPCallback``, or ``None`` for a non-private run."""
    return next((callback for callback in trainer.callbacks if isinstance(callback, DPCallback)), None)
