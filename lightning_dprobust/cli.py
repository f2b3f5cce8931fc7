"""The ``dprobust`` command: ``fit|validate|test`` through LightningCLI, plus the evaluation subcommands."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from lightning.pytorch.cli import LightningArgumentParser, LightningCLI
from lightning.pytorch.utilities.exceptions import MisconfigurationException

from lightning_dprobust.data.base import DatasetNotFoundError, ImageDataModule
from lightning_dprobust.methods.base import ClassifierModule

USER_ERRORS = (MisconfigurationException, DatasetNotFoundError, FileNotFoundError, ValueError)
"""Errors caused by a bad configuration or missing files: reported in one line, exit status 2."""


class DProbustCLI(LightningCLI):
    """LightningCLI whose model and data are any :class:`ClassifierModule` / :class:`ImageDataModule` subclass.

    The data module's ``num_classes``, ``input_shape``, ``mean`` and ``std`` are linked into the model, so a config
    names the dataset once.
    """

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        for attribute in ("num_classes", "input_shape", "mean", "std"):
            parser.link_arguments(f"data.{attribute}", f"model.init_args.{attribute}", apply_on="instantiate")


def run_lightning(args: Sequence[str]) -> None:
    DProbustCLI(
        ClassifierModule,
        ImageDataModule,
        subclass_mode_model=True,
        subclass_mode_data=True,
        args=list(args),
        save_config_kwargs={"overwrite": True},
        auto_configure_optimizers=False,
    )


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
        print(f"dprobust: error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
