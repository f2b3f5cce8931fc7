"""Arguments and helpers shared by the ``dprobust certify|attack|audit`` subcommands: the parser, the output flags,
the device, the checkpoints to evaluate and the split to evaluate them on."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

import torch
import yaml
from torch import nn
from torch.utils.data import Dataset

from lightning_dprobust.callbacks.guard import check_finite
from lightning_dprobust.cli.loading import load_classifier, load_denoised_classifier
from lightning_dprobust.data import DATAMODULES


class CommandParser(argparse.ArgumentParser):
    """ArgumentParser whose usage errors raise ``ValueError``, so ``dprobust`` reports them in one line, and which
    reads ``--config FILE``: a YAML mapping from flag names (``ckpt_path``, ``sigma``, ...) to values (a list repeats
    the flag; ``true``/``false`` switch ``--x``/``--no-x``), applied before the command line's flags.

    Args:
        flag_file: offer ``--config``; ``False`` for a command whose ``--config`` is a training config.
    """

    def __init__(self, *args: Any, flag_file: bool = True, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.flag_file = flag_file
        if flag_file:
            self.add_argument("--config", metavar="FILE", help="YAML file of flag values (the command line wins)")

    def error(self, message: str) -> NoReturn:
        raise ValueError(f"{self.prog}: {message} (see `{self.prog} --help`)")

    def parse_args(self, args: Sequence[str] | None = None, namespace: Any = None) -> argparse.Namespace:  # type: ignore[override]
        args = list(args or [])
        find = argparse.ArgumentParser(add_help=False)
        find.add_argument("--config")
        config = find.parse_known_args(args)[0].config if self.flag_file else None
        return super().parse_args([*config_flags(config), *args] if config else args, namespace)


def config_flags(path: str) -> list[str]:
    """The flags a ``--config`` YAML file stands for."""
    if not Path(path).is_file():
        raise FileNotFoundError(f"--config {path} does not exist")
    values = yaml.safe_load(Path(path).read_text()) or {}
    if not isinstance(values, dict):
        raise ValueError(f"--config {path} must be a YAML mapping of flag names to values, e.g. `sigma: 0.25`")
    flags: list[str] = []
    for key, value in values.items():
        flag = f"--{key}"
        if isinstance(value, bool):
            flags.append(flag if value else f"--no-{key}")
        else:
            for item in value if isinstance(value, list) else [value]:
                flags += [flag, str(item)]
    return flags


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
        device = torch.device(name)
    except RuntimeError as error:
        raise ValueError(f"--device {name!r} is not a torch device: use cpu, cuda or cuda:N") from error
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device {name}: no CUDA GPU is available here; use --device cpu (or auto)")
    if device.type == "cuda" and (device.index or 0) >= torch.cuda.device_count():
        raise ValueError(f"--device {name}: only {torch.cuda.device_count()} CUDA device(s) here")
    return device


def check_out(out: str) -> None:
    """``--out`` must be a folder (or not exist yet)."""
    if Path(out).exists() and not Path(out).is_dir():
        raise ValueError(f"--out {out} is a file: pass a folder (it is created if missing)")


_STAGES = {"train": "fit", "val": "validate", "test": "test"}


def evaluation_parser(command: str, description: str, batch_size: int) -> CommandParser:
    parser = CommandParser(prog=f"dprobust {command}", description=description)
    add = parser.add_argument
    add(
        "--ckpt_path",
        "--ckpt",
        dest="ckpt",
        action="append",
        required=True,
        metavar="PATH_OR_ZOO_NAME",
        help="a .ckpt written by `dprobust fit` or a zoo entry name; repeat to evaluate several models",
    )
    add("--data", default="digits", choices=sorted(DATAMODULES), help="data module (default: digits)")
    add("--split", default="test", choices=sorted(_STAGES), help="split to evaluate (default: test)")
    add(
        "--data.data_dir",
        "--data-dir",
        dest="data_dir",
        default=None,
        help="dataset folder (default: $DPROBUST_DATA/<data>)",
    )
    add("--max-examples", type=int, default=None, help="evaluate at most this many examples")
    add("--batch-size", type=int, default=batch_size, help=f"inputs per forward pass (default: {batch_size})")
    add("--seed", type=int, default=0, help="random seed (default: 0)")
    add_output_flags(parser, command)
    return parser


def require(ok: bool, flag: str, value: Any, expected: str) -> None:
    if not ok:
        raise ValueError(f"{flag} must be {expected}, got {value!r}")


def check_common(args: argparse.Namespace) -> None:
    check_out(args.out)
    require(args.batch_size >= 1, "--batch-size", args.batch_size, "an integer >= 1")
    require(args.max_examples is None or args.max_examples >= 1, "--max-examples", args.max_examples, ">= 1")


def labels(sources: Sequence[str]) -> list[str]:
    """Folder and legend names: a checkpoint file's stem or a zoo name, made unique with ``-2``, ``-3``, ..."""
    labels: list[str] = []
    for source in sources:
        path = Path(source)
        base = path.stem if path.suffix == ".ckpt" or path.exists() else source
        label, copy = base, 2
        while label in labels:
            label, copy = f"{base}-{copy}", copy + 1
        labels.append(label)
    return labels


def load_models(sources: Sequence[str], device: torch.device, denoiser: str | None = None) -> dict[str, nn.Module]:
    """All models by label (each behind ``denoiser``'s denoiser when given), loaded before any evaluation starts so a
    bad ``--ckpt`` or ``--denoiser`` (missing, unsafe, or with non-finite weights) fails fast."""
    from lightning_dprobust.zoo.catalog import ZooError

    flags = "--ckpt" if denoiser is None else "--ckpt / --denoiser"
    models = {}
    for label, source in zip(labels(sources), sources, strict=True):
        try:
            model = load_classifier(source) if denoiser is None else load_denoised_classifier(source, denoiser)
            models[label] = model.to(device)
            check_finite(models[label], f"{flags} {source}")
        except FileNotFoundError as error:
            raise FileNotFoundError(f"{flags}: {error}") from error
        except ZooError as error:
            raise ValueError(f"{flags} {source!r} is not a usable zoo entry or checkpoint file: {error}") from error
    return models


def load_split(args: argparse.Namespace) -> tuple[Dataset, int]:
    datamodule = DATAMODULES[args.data](data_dir=args.data_dir)
    datamodule.setup(_STAGES[args.split])
    dataset = getattr(datamodule, f"{args.split}_set")
    if dataset is None:
        raise ValueError(f"--data {args.data} has no {args.split!r} split: choose another --split")
    return dataset, datamodule.num_classes


def check_models_fit(models: dict[str, nn.Module], dataset: Dataset, num_classes: int, data: str) -> None:
    """Refuse a model whose input shape or number of classes differs from the data's, before any evaluation."""
    x = dataset[0][0].unsqueeze(0)
    for label, model in models.items():
        expected = (getattr(model, "hparams", None) or {}).get("input_shape")
        if expected is not None and tuple(expected) != tuple(x.shape[1:]):
            raise ValueError(
                f"--ckpt {label} takes inputs of shape {tuple(expected)} but --data {data} has {tuple(x.shape[1:])}: "
                "pass the --data it was trained on"
            )
        try:
            with torch.no_grad():
                logits = model(x.to(next(model.parameters()).device))
        except RuntimeError as error:
            message = f"--ckpt {label} does not fit --data {data} ({error}): pass the --data it was trained on"
            raise ValueError(message) from error
        if logits.shape[-1] != num_classes:
            raise ValueError(
                f"--ckpt {label} predicts {logits.shape[-1]} classes but --data {data} has {num_classes}: pass the "
                "--data it was trained on"
            )


def report_paths(paths: Sequence[Path | None]) -> None:
    print("\nwrote:")
    for path in paths:
        if path is not None:
            print(f"  {path}")
