"""Argument parsing shared by the ``dprobust certify|attack|audit`` subcommands."""

from __future__ import annotations

import argparse
from typing import NoReturn

import torch


class CommandParser(argparse.ArgumentParser):
    """ArgumentParser whose usage errors raise ``ValueError``, so ``dprobust`` reports them in one line."""

    def error(self, message: str) -> NoReturn:
        raise ValueError(f"{self.prog}: {message} (see `{self.prog} --help`)")


def add_output_flags(parser: argparse.ArgumentParser, command: str) -> None:
    """``--device``, ``--out`` (default ``runs/<command>``) and ``--wandb/--no-wandb``."""
    add = parser.add_argument
    add("--device", default="auto", help="torch device; auto: cuda if available, else cpu")
    add("--out", default=f"runs/{command}", help=f"output folder (default: runs/{command})")
    add(
        "--wandb",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="log to W&B, offline unless WANDB_MODE says otherwise (default: on)",
    )


def resolve_device(name: str) -> torch.device:
    """``auto`` is CUDA when available, else the CPU; anything else must be a torch device name."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        return torch.device(name)
    except RuntimeError as error:
        raise ValueError(f"--device {name!r} is not a torch device: use cpu, cuda or cuda:N") from error
