"""The ``dprobust`` evaluation subcommands outside LightningCLI: ``certify`` and ``attack``.

Each command is a callable ``(argv) -> None`` registered in :data:`COMMANDS`, which ``lightning_dprobust.cli.main``
dispatches to. Bad flags and missing files raise ``ValueError``/``FileNotFoundError`` naming the flag, which ``main``
reports in one line with exit status 2.
"""

from __future__ import annotations

import argparse
import inspect
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from lightning_dprobust.data import DATAMODULES
from lightning_dprobust.evaluation.audit_command import audit_command
from lightning_dprobust.evaluation.certify import (
    certify_dataset,
    format_summary,
    plot_certified_accuracy,
    summarize,
    write_csv,
    write_markdown,
)
from lightning_dprobust.evaluation.command_line import CommandParser, add_output_flags, resolve_device
from lightning_dprobust.evaluation.loading import load_classifier, load_denoised_classifier
from lightning_dprobust.evaluation.reports import log_wandb, write_text
from lightning_dprobust.zoo_cli import zoo_command

if TYPE_CHECKING:
    from torchattacks.attack import Attack

_STAGES = {"train": "fit", "val": "validate", "test": "test"}
_ATTACK_ALIASES = frozenset({"MIM"})
"""Suite names that repeat another entry (``MIM`` is ``MIFGSM``), left out of ``--attack all``."""
_ATTACK_OPTIONS = ("steps", "n_classes", "seed")
"""Command options passed to an attack builder when its signature names them."""


def _parser(command: str, description: str, batch_size: int) -> CommandParser:
    parser = CommandParser(prog=f"dprobust {command}", description=description)
    add = parser.add_argument
    add(
        "--ckpt",
        action="append",
        required=True,
        metavar="PATH_OR_ZOO_NAME",
        help="a .ckpt written by `dprobust fit` or a zoo entry name; repeat to evaluate several models",
    )
    add("--data", default="digits", choices=sorted(DATAMODULES), help="data module (default: digits)")
    add("--split", default="test", choices=sorted(_STAGES), help="split to evaluate (default: test)")
    add("--data-dir", default=None, help="dataset folder (default: $DPROBUST_DATA/<data>)")
    add("--max-examples", type=int, default=None, help="evaluate at most this many examples")
    add("--batch-size", type=int, default=batch_size, help=f"inputs per forward pass (default: {batch_size})")
    add("--seed", type=int, default=0, help="random seed (default: 0)")
    add_output_flags(parser, command)
    return parser


def _require(ok: bool, flag: str, value: Any, expected: str) -> None:
    if not ok:
        raise ValueError(f"{flag} must be {expected}, got {value!r}")


def _check_common(args: argparse.Namespace) -> None:
    _require(args.batch_size >= 1, "--batch-size", args.batch_size, "an integer >= 1")
    _require(args.max_examples is None or args.max_examples >= 1, "--max-examples", args.max_examples, ">= 1")


def _labels(sources: Sequence[str]) -> list[str]:
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


def _load_models(sources: Sequence[str], device: torch.device, denoiser: str | None = None) -> dict[str, nn.Module]:
    """All models by label (behind ``denoiser`` when given), loaded before any evaluation so a bad flag fails fast."""
    from lightning_dprobust.zoo_catalog import ZooError

    models = {}
    for label, source in zip(_labels(sources), sources, strict=True):
        try:
            model = load_classifier(source) if denoiser is None else load_denoised_classifier(source, denoiser)
            models[label] = model.to(device)
        except FileNotFoundError as error:
            raise FileNotFoundError(f"--ckpt: {error}") from error
        except ZooError as error:
            raise ValueError(f"--ckpt {source!r} is not a usable zoo entry or checkpoint file: {error}") from error
    return models


def _load_split(args: argparse.Namespace) -> tuple[Dataset, int]:
    datamodule = DATAMODULES[args.data](data_dir=args.data_dir)
    datamodule.setup(_STAGES[args.split])
    dataset = getattr(datamodule, f"{args.split}_set")
    if dataset is None:
        raise ValueError(f"--data {args.data} has no {args.split!r} split: choose another --split")
    return dataset, datamodule.num_classes


def _report(paths: Sequence[Path | None]) -> None:
    print("\nwrote:")
    for path in paths:
        if path is not None:
            print(f"  {path}")


# --------------------------------------------------------------------------------------------------- certify
def _certify_parser() -> CommandParser:
    parser = _parser("certify", "Certify checkpoints with randomized smoothing (Cohen et al. 2019).", 1000)
    add = parser.add_argument
    add("--sigma", type=float, default=0.25, help="noise std in pixel units (default: 0.25)")
    add("--n0", type=int, default=100, help="selection draws per example (default: 100)")
    add("--n", type=int, default=100_000, help="estimation draws per example (default: 100000)")
    add("--alpha", type=float, default=0.001, help="failure probability (default: 0.001)")
    add("--skip", type=int, default=1, help="certify every skip-th example (default: 1)")
    add(
        "--denoiser",
        default=None,
        metavar="PATH_OR_ZOO_NAME",
        help="certify each --ckpt classifier behind this denoiser: a TransDenoiser .ckpt or a zoo denoiser entry",
    )
    add("--progress", action=argparse.BooleanOptionalAction, default=True, help="show a progress bar")
    return parser


def _check_certify(args: argparse.Namespace) -> None:
    _check_common(args)
    _require(math.isfinite(args.sigma) and args.sigma > 0, "--sigma", args.sigma, "a finite number > 0")
    _require(args.n0 >= 1, "--n0", args.n0, "an integer >= 1")
    _require(args.n >= 1, "--n", args.n, "an integer >= 1")
    _require(0 < args.alpha < 1, "--alpha", args.alpha, "in (0, 1)")
    _require(args.skip >= 1, "--skip", args.skip, "an integer >= 1")


def certify_command(argv: Sequence[str]) -> None:
    """``dprobust certify``: CERTIFY of Cohen et al. (2019, https://arxiv.org/abs/1902.02918) on each ``--ckpt``.

    Writes ``<out>/<label>/certify.csv`` and ``<out>/<label>/summary.md`` per checkpoint and one
    ``<out>/certified_accuracy.png`` with every checkpoint's curve, prints the summary table and the paths, and logs
    the summary and the plot to W&B (offline unless ``WANDB_MODE`` says otherwise) unless ``--no-wandb``.
    """
    args = _certify_parser().parse_args(argv)
    _check_certify(args)
    models = _load_models(args.ckpt, resolve_device(args.device), args.denoiser)
    dataset, num_classes = _load_split(args)
    out, curves, summaries, written = Path(args.out), {}, {}, []
    options = {key: getattr(args, key) for key in ("sigma", "n0", "n", "alpha", "batch_size", "seed", "skip")}
    for label, model in models.items():
        curves[label] = certify_dataset(
            model,
            dataset,
            max_examples=args.max_examples,
            progress=args.progress,
            num_classes=num_classes,
            desc=label,
            **options,
        )
        summaries[label] = summarize(curves[label])
        written.append(write_csv(curves[label], out / label / "certify.csv"))
        written.append(write_markdown(summaries[label], out / label / "summary.md", label=label))
    plot = plot_certified_accuracy(curves, out / "certified_accuracy.png")
    settings = ", ".join(f"{key}={value}" for key, value in options.items())
    print(f"\n{args.data}/{args.split}: {settings}\n\n{format_summary(summaries)}")
    if args.wandb:
        metrics = {f"{label}/{key}": value for label, summary in summaries.items() for key, value in summary.items()}
        written.append(log_wandb(out, "certify", vars(args), metrics, {"certified_accuracy": plot}))
    _report([*written, plot])


# ---------------------------------------------------------------------------------------------------- attack
def _attack_parser() -> CommandParser:
    from lightning_dprobust.evaluation.attacks import ATTACKS

    parser = _parser("attack", "Clean and robust accuracy of checkpoints under the attack suite.", 256)
    add = parser.add_argument
    add(
        "--attack",
        action="append",
        default=None,
        metavar="NAME",
        help=f"one of {sorted(ATTACKS)} (case-insensitive) or 'all'; repeat for several (default: PGD)",
    )
    add("--eps", type=float, default=8 / 255, help="budget in pixel units, Linf or L2 by attack (default: 8/255)")
    add("--steps", type=int, default=None, help="iterations of the attacks that take a step count")
    return parser


def _attack_names(requested: Sequence[str] | None) -> list[str]:
    from lightning_dprobust.evaluation.attacks import ATTACKS

    names: list[str] = []
    for name in requested or ["PGD"]:
        chosen = [key for key in ATTACKS if key not in _ATTACK_ALIASES] if name.lower() == "all" else [name.upper()]
        for key in chosen:
            if key not in ATTACKS:
                raise ValueError(f"--attack {name!r} is unknown: choose from {sorted(ATTACKS)} or 'all'")
            if key not in names:
                names.append(key)
    return names


def _build_attack(name: str, model: nn.Module, args: argparse.Namespace, n_classes: int) -> Attack:
    from lightning_dprobust.evaluation.attacks import ATTACKS, build_attack

    accepted = inspect.signature(ATTACKS[name]).parameters
    values = {"steps": args.steps, "n_classes": n_classes, "seed": args.seed}
    kwargs = {key: values[key] for key in _ATTACK_OPTIONS if key in accepted and values[key] is not None}
    return build_attack(name, model, args.eps, **kwargs)


def _attack_metrics(label: str, results: dict[str, float]) -> dict[str, float]:
    """W&B keys: ``<label>/clean_acc`` and ``<label>/robust_acc/<attack>``."""
    metrics = {f"{label}/clean_acc": results["clean"]}
    metrics.update({f"{label}/robust_acc/{name}": value for name, value in results.items() if name != "clean"})
    return metrics


def attack_command(argv: Sequence[str]) -> None:
    """``dprobust attack``: clean and robust accuracy (Madry et al. 2018, https://arxiv.org/abs/1706.06083).

    For each ``--ckpt`` and each ``--attack``, prints and writes ``<out>/<label>/attack.md`` (rows ``clean`` and one
    per attack, accuracies in percent) and logs them to W&B. Attacks run independently on every example. The global
    torch seed is set to ``--seed`` before each checkpoint, so PGD's random start is reproducible.
    """
    from lightning_dprobust.evaluation.attacks import format_table, robust_accuracy

    args = _attack_parser().parse_args(argv)
    _check_common(args)
    _require(math.isfinite(args.eps) and args.eps >= 0, "--eps", args.eps, "a finite number >= 0")
    _require(args.steps is None or args.steps >= 1, "--steps", args.steps, "an integer >= 1")
    names, device = _attack_names(args.attack), resolve_device(args.device)
    models = _load_models(args.ckpt, device)
    dataset, num_classes = _load_split(args)
    out, metrics, written = Path(args.out), {}, []
    for label, model in models.items():
        torch.manual_seed(args.seed)
        suite = {name: _build_attack(name, model, args, num_classes) for name in names}
        loader = DataLoader(dataset, batch_size=args.batch_size)
        results = robust_accuracy(model, loader, suite, device=device, max_examples=args.max_examples)
        table = format_table(results)
        print(f"\n{label}: {args.data}/{args.split}, eps={args.eps:g}\n\n{table}")
        written.append(write_text(table, out / label / "attack.md"))
        metrics.update(_attack_metrics(label, results))
    if args.wandb:
        written.append(log_wandb(out, "attack", vars(args), metrics))
    _report(written)


COMMANDS: dict[str, Callable[[Sequence[str]], None]] = {
    "certify": certify_command,
    "attack": attack_command,
    "audit": audit_command,
    "zoo": zoo_command,
}
"""Evaluation subcommands of ``dprobust`` by name; each takes the arguments after the name."""
