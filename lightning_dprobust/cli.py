"""The ``dprobust`` command: ``fit|validate|test`` through LightningCLI, plus the evaluation subcommands."""

from __future__ import annotations

import sys
from collections.abc import Sequence

import lightning as L
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI, SaveConfigCallback
from lightning.pytorch.utilities.exceptions import MisconfigurationException

from lightning_dprobust.checkpoint_io import read_checkpoint
from lightning_dprobust.data.base import DatasetNotFoundError, ImageDataModule
from lightning_dprobust.methods.base import ClassifierModule

USER_ERRORS = (MisconfigurationException, DatasetNotFoundError, FileNotFoundError, ValueError)
"""Errors caused by a bad configuration or missing files: reported in one line, exit status 2."""


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


def run_lightning(args: Sequence[str]) -> None:
    DProbustCLI(args=args)


SUBCOMMANDS = ("certify", "attack", "audit", "zoo")
"""``dprobust`` subcommands outside LightningCLI (the rest go to ``fit|validate|test``)."""


def _run_subcommand(name: str, args: Sequence[str]) -> None:
    """Import lazily, so ``dprobust fit`` does not load the evaluation stack."""
    from lightning_dprobust.evaluation.commands import COMMANDS

    COMMANDS[name](args)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``dprobust`` console script; returns the exit status."""
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        if args and args[0] in SUBCOMMANDS:
            _run_subcommand(args[0], args[1:])
        else:
            run_lightning(args)
    except USER_ERRORS as error:
        print(f"dprobust: error: {_root_cause(error)}", file=sys.stderr)
        return 2
    return 0


def _root_cause(error: BaseException) -> BaseException:
    """The user error itself when jsonargparse wrapped it (a refused class argument) in a report of every type tried."""
    cause = error.__cause__ or error.__context__
    while _raised_in_jsonargparse(error) and isinstance(cause, USER_ERRORS):
        error, cause = cause, cause.__cause__ or cause.__context__
    return error


def _raised_in_jsonargparse(error: BaseException) -> bool:
    frame = error.__traceback__
    while frame is not None and frame.tb_next is not None:
        frame = frame.tb_next
    return frame is not None and "jsonargparse" in frame.tb_frame.f_code.co_filename


if __name__ == "__main__":
    raise SystemExit(main())
