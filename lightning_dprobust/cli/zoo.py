"""``dprobust zoo list|info|download|build``: the checkpoint zoo from the command line."""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Sequence

from lightning_dprobust import zoo
from lightning_dprobust.zoo.catalog import Entry, ZooError

_COLUMNS = ("name", "status", "dataset", "epsilon", "metrics")


def _format_metrics(metrics: dict | None) -> str:
    if not metrics:
        return ""
    return ", ".join(
        f"{key}={value:.4g}" if isinstance(value, float) else f"{key}={value}" for key, value in metrics.items()
    )


def _epsilon(entry: Entry) -> str:
    """A shipped entry's recorded epsilon to three decimals (2.997, not the rounded 3); a recipe's target."""
    privacy = entry.meta["privacy"]
    if privacy is None:
        return "inf (not private)"
    epsilon = privacy["epsilon"]
    if epsilon is None:
        return "?"
    if math.isinf(epsilon):
        return "inf"
    if privacy["accountant"] == "nominal":
        return f"{epsilon:.3f} nominal (no DP guarantee)"
    return f"{epsilon:.3f}" if entry.shipped else f"{epsilon:g} (target)"


def table_rows(entries: Sequence[Entry]) -> list[tuple[str, ...]]:
    """One row per entry: name, status, dataset, epsilon, and the measured (or, for recipes, target) metrics."""
    rows = []
    for entry in entries:
        if entry.shipped:
            metrics = _format_metrics(entry.meta["metrics"])
        else:
            target = _format_metrics(entry.meta.get("target_metrics"))
            metrics = f"target: {target}" if target else ""
        rows.append((entry.name, entry.status, entry.meta["dataset"], _epsilon(entry), metrics))
    return rows


def format_table(rows: Sequence[tuple[str, ...]]) -> str:
    """A plain-text table with a header row and left-aligned columns."""
    widths = [max(len(str(row[i])) for row in (_COLUMNS, *rows)) for i in range(len(_COLUMNS))]
    lines = [
        "  ".join(str(cell).ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in (_COLUMNS, *rows)
    ]
    return "\n".join(lines)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dprobust zoo", description="Trained models with their privacy provenance.")
    commands = parser.add_subparsers(dest="command", required=True)
    listing = commands.add_parser("list", help="list the catalog entries")
    listing.add_argument("pattern", nargs="?", default="*", help="shell pattern on the names (default: all)")
    commands.add_parser("info", help="print one entry").add_argument("name")
    fetch = commands.add_parser("download", help="download and verify the weights of an entry")
    fetch.add_argument("name")
    fetch.add_argument("--force", action="store_true", help="download again even when cached")
    train = commands.add_parser("build", help="train an entry from its recipe and publish its weights")
    train.add_argument("name")
    train.add_argument("--epochs", type=int, default=None, help="override trainer.max_epochs")
    train.add_argument("--out", default=None, help="zoo directory for weights/ and entries/ (default: the catalog)")
    return parser


def _run(args: argparse.Namespace) -> None:
    if args.command == "list":
        entries = zoo.list_entries(args.pattern)
        if not entries:
            raise ZooError(f"no zoo entry matches {args.pattern!r}; run `dprobust zoo list` to see them all")
        print(format_table(table_rows(entries)))
    elif args.command == "info":
        entry = zoo.info(args.name)
        print(entry.to_yaml(), end="")
    elif args.command == "download":
        print(zoo.download(args.name, force=args.force))
    else:
        from lightning_dprobust.zoo.build import build

        entry = build(args.name, epochs=args.epochs, out_dir=args.out)
        print(format_table(table_rows([entry])))
        print(f"weights: {entry.file}  sha256: {entry.sha256}")


def zoo_command(argv: Sequence[str]) -> None:
    """Run ``dprobust zoo`` with the arguments after ``zoo``.

    Exits with status 2 (after one line on stderr) when the zoo refuses the request: unknown name, recipe-only
    entry, failed download or checksum, or an unsafe checkpoint.
    """
    args = _parser().parse_args(list(argv))
    try:
        _run(args)
    except ZooError as error:
        print(f"dprobust zoo: error: {error}", file=sys.stderr)
        raise SystemExit(2) from error
