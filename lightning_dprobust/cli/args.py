"""Arguments and helpers shared by the ``dprobust certify|attack|audit|synthesize|zoo`` subcommands: the parser, the
output flags, the device, the checkpoints to evaluate and the split to evaluate them on.

One dialect: the same spellings as ``dprobust fit`` for the same things (``--ckpt_path``, ``--config``,
``--data.data_dir``, ``--seed``, ``--out``, underscores in multi-word flags such as ``--batch_size``). The older
spellings (``--ckpt``, ``--batch-size``, ...) still work as deprecated aliases and print one warning line.

This module imports neither torch nor Lightning at import time, so ``--help`` of every subcommand is fast."""

from __future__ import annotations

import argparse
import itertools
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import yaml

from lightning_dprobust.robustness.reports import check_wandb_login

if TYPE_CHECKING:
    import torch
    from torch import nn
    from torch.utils.data import Dataset

DATA_NAMES = ("celeba", "cifar10", "cifar100", "digits", "fashion_mnist", "idc", "mnist", "mnist5k", "tiny_imagenet")
"""The ``--data`` choices (the keys of :data:`lightning_dprobust.data.DATAMODULES`, listed here so that parsing
needs no torch import; a test keeps the two equal)."""


class DuplicateKeyLoader(yaml.SafeLoader):
    """A safe YAML loader that refuses a key written twice in one mapping (PyYAML keeps the last one silently)."""


def _mapping_without_duplicates(loader: DuplicateKeyLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    keys = [loader.construct_object(key, deep=True) for key, _ in node.value]
    seen: set = set()
    for key, (key_node, _) in zip(keys, node.value, strict=True):
        if key in seen:
            line = key_node.start_mark.line + 1
            raise ValueError(
                f"{key_node.start_mark.name}: line {line}: key {key!r} appears twice in the same mapping; keep one"
            )
        seen.add(key)
    return loader.construct_mapping(node, deep=deep)


DuplicateKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping_without_duplicates)


def load_yaml(text: str, source: str = "<yaml>") -> Any:
    """``yaml.safe_load`` that refuses a duplicated key with ``ValueError`` naming it and its line."""
    loader = DuplicateKeyLoader(text)
    loader.name = source
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


class CommandParser(argparse.ArgumentParser):
    """ArgumentParser whose usage errors raise ``ValueError``, so ``dprobust`` reports them in one line, which reads
    ``--config FILE`` (a YAML mapping from flag names (``ckpt_path``, ``sigma``, ...) to values (a list repeats the
    flag; ``true``/``false`` switch ``--x``/``--no-x``), applied before the command line's flags), and which accepts
    the older spelling of a flag (:meth:`add_flag`) with one warning line.

    Args:
        flag_file: offer ``--config``; ``False`` for a command whose ``--config`` is a training config.
    """

    def __init__(self, *args: Any, flag_file: bool = True, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.flag_file = flag_file
        self.deprecated: dict[str, str] = {}
        if flag_file:
            self.add_argument("--config", metavar="FILE", help="YAML file of flag values (the command line wins)")

    def add_flag(self, flag: str, *old: str, **kwargs: Any) -> argparse.Action:
        """``--flag`` with the deprecated spellings ``old`` (hidden from ``--help``, one warning line when used)."""
        for alias in old:
            self.deprecated[alias] = flag
        return self.add_argument(flag, *old, **kwargs)

    def format_help(self) -> str:
        text = super().format_help()
        for alias in self.deprecated:
            text = text.replace(f", {alias} {_metavar_after(text, alias)}", "").replace(f", {alias}", "")
        return text

    def error(self, message: str) -> NoReturn:
        raise ValueError(f"{self.prog}: {message} (see `{self.prog} --help`)")

    def parse_args(self, args: Sequence[str] | None = None, namespace: Any = None) -> argparse.Namespace:  # type: ignore[override]
        args = list(args or [])
        find = argparse.ArgumentParser(add_help=False)
        find.add_argument("--config")
        config = find.parse_known_args(args)[0].config if self.flag_file else None
        warned = set()
        for token in args:
            name = token.split("=", 1)[0]
            if name in self.deprecated and name not in warned:
                warned.add(name)
                print(f"{self.prog}: warning: {name} is deprecated, use {self.deprecated[name]}", file=sys.stderr)
        return super().parse_args([*config_flags(config), *args] if config else args, namespace)


def _metavar_after(text: str, alias: str) -> str:
    """The metavar printed after ``alias`` in the help text (``""`` when none)."""
    index = text.find(f", {alias} ")
    if index < 0:
        return ""
    rest = text[index + len(alias) + 3 :]
    word = rest.split(",")[0].split("\n")[0].split(" ")[0]
    return word if word.isupper() or word.startswith("{") else ""


def config_flags(path: str) -> list[str]:
    """The flags a ``--config`` YAML file stands for."""
    if not Path(path).is_file():
        raise FileNotFoundError(f"--config {path} does not exist")
    values = load_yaml(Path(path).read_text(), path) or {}
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


def add_wandb_flags(parser: argparse.ArgumentParser) -> None:
    """``--wandb.project``, ``--wandb.entity`` and ``--wandb.group``: where a command's W&B run goes."""
    add = parser.add_argument
    add("--wandb.project", dest="wandb_project", default=None, help="W&B project (default: dprobust)")
    add("--wandb.entity", dest="wandb_entity", default=None, help="W&B entity, a user or team (default: yours)")
    add("--wandb.group", dest="wandb_group", default=None, help="W&B group of the run (default: none)")


def add_output_flags(parser: CommandParser, command: str, label: str = "<ckpt-stem>") -> None:
    """``--device``, ``--out`` (default: a new ``runs/<command>/<label>-N``), ``--overwrite``, ``--wandb/--no-wandb``
    and the W&B project, entity and group."""
    add = parser.add_argument
    add("--device", default="auto", help="torch device; auto: cuda if available, else cpu")
    add(
        "--out",
        default=None,
        help=f"this run's output folder (default: a new runs/{command}/{label}-N, never reused); an existing "
        "non-empty folder only with --overwrite",
    )
    add("--overwrite", action="store_true", help="write into --out even if it already holds files")
    add(
        "--wandb",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="log to W&B, offline unless WANDB_MODE says otherwise (default: on)",
    )
    add_wandb_flags(parser)


def wandb_options(args: argparse.Namespace) -> dict[str, str | None]:
    """The ``project``, ``entity`` and ``group`` of ``--wandb.*`` for :func:`~lightning_dprobust.robustness.reports.
    log_wandb`."""
    return {key: getattr(args, f"wandb_{key}", None) for key in ("project", "entity", "group")}


def resolve_device(name: str) -> torch.device:
    """``auto`` is CUDA when available, else the CPU; anything else must be a torch device name."""
    import torch

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


def check_out(out: str | None, overwrite: bool = False) -> None:
    """``--out`` must be a folder (or not exist yet), and hold no files unless ``--overwrite``."""
    if out is None:
        return
    path = Path(out)
    if path.exists() and not path.is_dir():
        raise ValueError(f"--out {out} is a file: pass a folder (it is created if missing)")
    if path.is_dir() and any(path.iterdir()) and not overwrite:
        raise ValueError(
            f"--out {out} already holds files (another run's?): pass a new folder, leave --out out for a fresh "
            "runs/... folder, or add --overwrite"
        )


def run_folder(out: str | None, command: str, label: str) -> Path:
    """This run's output folder, created now: ``--out`` (checked by :func:`check_out`), else the first free
    ``runs/<command>/<label>-N`` (N = 1, 2, ...), claimed atomically so that two runs never share one."""
    if out is not None:
        Path(out).mkdir(parents=True, exist_ok=True)
        return Path(out)
    base = Path("runs") / command
    base.mkdir(parents=True, exist_ok=True)
    safe = "".join(c if c.isalnum() or c in "-_.+@" else "_" for c in label) or command
    for number in itertools.count(1):
        folder = base / f"{safe}-{number}"
        try:
            folder.mkdir()
        except FileExistsError:
            continue
        return folder
    raise AssertionError("unreachable")


_STAGES = {"train": "fit", "val": "validate", "test": "test"}


def add_ckpt_flag(parser: CommandParser, help: str, repeat: bool = True, required: bool = True) -> None:
    """``--ckpt_path`` (old spelling ``--ckpt``) into ``args.ckpt``."""
    parser.add_flag(
        "--ckpt_path",
        "--ckpt",
        dest="ckpt",
        action="append" if repeat else "store",
        required=required,
        metavar="PATH_OR_ZOO_NAME",
        help=help,
    )


def add_data_flags(parser: CommandParser, default: str | None = "digits", prefix: str = "") -> None:
    """``--data NAME`` and ``--data.data_dir`` (old spelling ``--data-dir``)."""
    parser.add_argument("--data", default=default, choices=DATA_NAMES, help=f"{prefix}data module (default: {default})")
    parser.add_flag(
        "--data.data_dir",
        "--data-dir",
        dest="data_dir",
        default=None,
        help=f"{prefix}dataset folder (default: $DPROBUST_DATA/<data>)",
    )


def evaluation_parser(command: str, description: str, batch_size: int) -> CommandParser:
    parser = CommandParser(prog=f"dprobust {command}", description=description)
    add_ckpt_flag(parser, "a .ckpt written by `dprobust fit` or a zoo entry name; repeat to evaluate several models")
    add_data_flags(parser)
    parser.add_argument("--split", default="test", choices=sorted(_STAGES), help="split to evaluate (default: test)")
    parser.add_flag(
        "--max_examples", "--max-examples", type=int, default=None, help="evaluate at most this many examples"
    )
    parser.add_flag(
        "--batch_size",
        "--batch-size",
        type=int,
        default=batch_size,
        help=f"inputs per forward pass (default: {batch_size})",
    )
    parser.add_argument("--seed", type=int, default=0, help="random seed (default: 0)")
    add_output_flags(parser, command)
    return parser


def require(ok: bool, flag: str, value: Any, expected: str) -> None:
    if not ok:
        raise ValueError(f"{flag} must be {expected}, got {value!r}")


def check_common(args: argparse.Namespace) -> None:
    check_out(args.out, args.overwrite)
    require(args.batch_size >= 1, "--batch_size", args.batch_size, "an integer >= 1")
    require(args.max_examples is None or args.max_examples >= 1, "--max_examples", args.max_examples, ">= 1")
    if args.wandb:
        check_wandb_login()


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
    bad ``--ckpt_path`` or ``--denoiser`` (missing, unsafe, or with non-finite weights) fails fast."""
    from lightning_dprobust.callbacks.guard import check_finite
    from lightning_dprobust.cli.loading import load_classifier, load_denoised_classifier
    from lightning_dprobust.zoo.catalog import ZooError

    flags = "--ckpt_path" if denoiser is None else "--ckpt_path / --denoiser"
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
    from lightning_dprobust.data import DATAMODULES

    datamodule = DATAMODULES[args.data](data_dir=args.data_dir)
    datamodule.setup(_STAGES[args.split])
    dataset = getattr(datamodule, f"{args.split}_set")
    if dataset is None:
        raise ValueError(f"--data {args.data} has no {args.split!r} split: choose another --split")
    return dataset, datamodule.num_classes


def check_models_fit(models: dict[str, nn.Module], dataset: Dataset, num_classes: int, data: str) -> None:
    """Refuse a model whose input shape or number of classes differs from the data's, before any evaluation."""
    import torch

    x = dataset[0][0].unsqueeze(0)
    for label, model in models.items():
        expected = (getattr(model, "hparams", None) or {}).get("input_shape")
        if expected is not None and tuple(expected) != tuple(x.shape[1:]):
            raise ValueError(
                f"--ckpt_path {label} takes inputs of shape {tuple(expected)} but --data {data} has "
                f"{tuple(x.shape[1:])}: pass the --data it was trained on"
            )
        try:
            with torch.no_grad():
                logits = model(x.to(next(model.parameters()).device))
        except RuntimeError as error:
            message = f"--ckpt_path {label} does not fit --data {data} ({error}): pass the --data it was trained on"
            raise ValueError(message) from error
        if logits.shape[-1] != num_classes:
            raise ValueError(
                f"--ckpt_path {label} predicts {logits.shape[-1]} classes but --data {data} has {num_classes}: "
                "pass the --data it was trained on"
            )


def report_paths(paths: Sequence[Path | None]) -> None:
    """Print the files a command wrote."""
    print("\nwrote:")
    for path in paths:
        if path is not None:
            print(f"  {path}")
