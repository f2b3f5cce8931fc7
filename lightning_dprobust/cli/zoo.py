"""``dprobust zoo list|info|download|build``: the checkpoint zoo from the command line.

``list`` and ``info`` read only the catalog's YAML files: they load neither torch nor Lightning. ``build`` writes
into a user folder (``--out``, default a new ``runs/zoo/<name>-N``); the shipped catalog is written only when
``--out`` names it and ``--overwrite`` is given."""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Sequence
from pathlib import Path

from lightning_dprobust.cli.args import CommandParser, run_folder
from lightning_dprobust.zoo.catalog import Entry, ZooError

_COLUMNS = ("name", "status", "dataset", "epsilon", "metrics")


def _format_metrics(metrics: dict | None) -> str:
    if not metrics:
        return ""
    return ", ".join(
        f"{key}={value:.4g}" if isinstance(value, float) else f"{key}={value}" for key, value in metrics.items()
    )


def epsilon_cell(entry: Entry) -> str:
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
        rows.append((entry.name, entry.status, entry.meta["dataset"], epsilon_cell(entry), metrics))
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
    parser = CommandParser(
        prog="dprobust zoo", description="Trained models with their privacy provenance.", flag_file=False
    )
    commands = parser.add_subparsers(dest="command", required=True, parser_class=CommandParser)
    listing = commands.add_parser("list", help="list the catalog entries", flag_file=False)
    listing.add_argument("pattern", nargs="?", default="*", help="shell pattern on the names (default: all)")
    commands.add_parser("info", help="print one entry", flag_file=False).add_argument("name")
    fetch = commands.add_parser("download", help="download and verify the weights of an entry", flag_file=False)
    fetch.add_argument("name")
    fetch.add_argument("--force", action="store_true", help="download again even when cached")
    train = commands.add_parser("build", help="train an entry from its recipe into a zoo folder", flag_file=False)
    train.add_argument("name")
    train.add_argument("--epochs", type=int, default=None, help="override trainer.max_epochs")
    train.add_argument(
        "--out",
        default=None,
        help="zoo folder that receives weights/ and entries/ (default: a new runs/zoo/<name>-N); the shipped "
        "catalog only with --overwrite",
    )
    train.add_argument(
        "--overwrite", action="store_true", help="replace the entry (and its weights) if --out already holds it"
    )
    return parser


def build_folder(name: str, out: str | None, overwrite: bool) -> Path:
    """Where ``zoo build`` writes: ``--out``, else a new ``runs/zoo/<name>-N``. A folder that already holds the
    entry (the shipped catalog always does) is refused without ``--overwrite``, before any training."""
    from lightning_dprobust.zoo.hub import ZOO_DIR

    if out is None:
        return run_folder(None, "zoo", name)
    folder = Path(out)
    if folder.exists() and not folder.is_dir():
        raise ZooError(f"--out {out} is a file: pass a folder for weights/ and entries/")
    catalog = folder.resolve() == ZOO_DIR.resolve()
    if (catalog or (folder / "entries" / f"{name}.yaml").exists()) and not overwrite:
        what = "the shipped catalog" if catalog else "a zoo folder that already holds this entry"
        raise ZooError(
            f"--out {out} is {what}: building {name} there would replace its published weights; leave --out out "
            "(a new runs/zoo/... folder) or add --overwrite"
        )
    return folder


def _run(args: argparse.Namespace) -> None:
    if args.command == "list":
        from lightning_dprobust.zoo.hub import Zoo

        entries = Zoo().list_entries(args.pattern)
        if not entries:
            raise ZooError(f"no zoo entry matches {args.pattern!r}; run `dprobust zoo list` to see them all")
        print(format_table(table_rows(entries)))
    elif args.command == "info":
        from lightning_dprobust.zoo.hub import Zoo

        print(Zoo().info(args.name).to_yaml(), end="")
    elif args.command == "download":
        from lightning_dprobust import zoo

        print(zoo.download(args.name, force=args.force))
    else:
        from lightning_dprobust.zoo import build as zoo_build
        from lightning_dprobust.zoo.hub import Zoo

        Zoo().info(args.name)  # an unknown name fails before a folder is made
        out = build_folder(args.name, args.out, args.overwrite)
        entry = zoo_build.build(args.name, epochs=args.epochs, out_dir=str(out))
        print(format_table(table_rows([entry])))
        print(f"weights: {out / 'weights' / str(entry.file)}  sha256: {entry.sha256}")
        print(f"entry: {out / 'entries' / (entry.name + '.yaml')}")


def zoo_command(argv: Sequence[str]) -> None:
    """Run ``dprobust zoo`` with the arguments after ``zoo``.

    Exits with status 2 (after one line on stderr) when the zoo refuses the request: a usage error, unknown name,
    recipe-only entry, failed download or checksum, an unsafe checkpoint, or a build that would overwrite an entry.
    """
    try:
        args = _parser().parse_args(list(argv))
        _run(args)
    except (ZooError, ValueError) as error:
        print(f"dprobust zoo: error: {error}", file=sys.stderr)
        raise SystemExit(2) from error
