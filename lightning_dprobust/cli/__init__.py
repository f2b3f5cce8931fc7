"""The ``dprobust`` command: ``fit|validate|test`` through :class:`~lightning_dprobust.recipes.DProbustCLI`, and one
module per other subcommand (``certify``, ``attack``, ``audit``, ``zoo``)."""

from lightning_dprobust.cli.main import main

__all__ = ["main"]
