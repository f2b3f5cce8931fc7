"""The one config-to-trainer path: :class:`DProbustCLI` (``dprobust fit|validate|test``) and the recipe helpers that
run a YAML recipe from Python exactly as ``dprobust fit --config`` would (demo, zoo builds, audits, benchmarks)."""

from __future__ import annotations

import tempfile
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import lightning as L
import yaml
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI, SaveConfigCallback

from lightning_dprobust.callbacks import DPCallback
from lightning_dprobust.checkpoint_io import read_checkpoint
from lightning_dprobust.data.base import ImageDataModule
from lightning_dprobust.methods.base import ClassifierModule

CONFIG_DIR = Path(__file__).resolve().parents[1] / "configs"
"""The shipped recipes, ``configs/<method>/<dataset>.yaml``."""


class DProbustCLI(LightningCLI):
    """LightningCLI whose model and data are any :class:`ClassifierModule` / :class:`ImageDataModule` subclass.

    The data module's ``num_classes``, ``input_shape``, ``mean`` and ``std`` are linked into the model, so a config
    names the dataset once. Checkpoints are written atomically (:class:`AtomicCheckpointIO`), ``--ckpt_path`` is
    read with ``weights_only=True`` before Lightning touches it, and ``config.yaml`` is written only once training
    starts, so a refused run leaves an existing run folder as it was.

    Args:
        args: the command line (``None``: ``sys.argv``).
        run: run the subcommand; ``False`` only instantiates the trainer, model and data.
    """

    def __init__(self, args: Sequence[str] | None = None, run: bool = True) -> None:
        super().__init__(
            ClassifierModule,
            ImageDataModule,
            subclass_mode_model=True,
            subclass_mode_data=True,
            args=None if args is None else list(args),
            run=run,
            save_config_callback=SaveConfigWhenTraining,
            save_config_kwargs={"overwrite": True},
            trainer_defaults={"plugins": [{"class_path": "lightning_dprobust.checkpoint_io.AtomicCheckpointIO"}]},
            auto_configure_optimizers=False,
        )

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        for attribute in ("num_classes", "input_shape", "mean", "std"):
            parser.link_arguments(f"data.{attribute}", f"model.init_args.{attribute}", apply_on="instantiate")

    def _parse_ckpt_path(self) -> None:
        """Read ``--ckpt_path`` safely first: a truncated or unsafe file is one ``CheckpointError`` (exit 2)."""
        subcommand = self.config.get("subcommand")
        ckpt_path = self.config[subcommand].get("ckpt_path") if subcommand else None
        if ckpt_path and ckpt_path not in ("last", "best", "hpc", "registry"):
            read_checkpoint(ckpt_path)
        super()._parse_ckpt_path()


class SaveConfigWhenTraining(SaveConfigCallback):
    """Writes ``config.yaml`` once training starts, so a run refused at setup or resume (a bad value, a checkpoint
    of another run) leaves the config of the run that wrote the folder's checkpoints in place."""

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage != "fit":
            super().setup(trainer, pl_module, stage)

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().setup(trainer, pl_module, "fit")


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
