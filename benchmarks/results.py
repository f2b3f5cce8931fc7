"""Result files: every number the docs show comes from one of these, written by the benchmark that measured it.

A result file is ``results/<name>.json`` with what it takes to trust and re-run a table:

* ``name``, ``title``: the file's stem and a one-line caption;
* ``command``: the command line that wrote it (re-run it to refresh the file);
* ``commit``: the git commit it ran at, with ``+dirty`` when the working tree had uncommitted changes;
* ``machine``: platform, processor count, torch version and the device used;
* ``date``: UTC time of writing (ISO 8601);
* ``seeds``: the seeds behind every spread in the table (empty when the table is not seeded, e.g. a ratio of timings);
* ``columns`` and ``rows``: the table, each cell already formatted (``'92.86 +- 1.16'``);
* ``notes``: what a reader needs to read the table (spread definition, what is nominal, the baseline);
* ``raw``: optional per-seed or per-round values behind the cells.

The docs pages hold a copy of each table between ``<!-- results:NAME -->`` and ``<!-- /results:NAME -->``;
``benchmarks/render_results.py`` writes those copies and a test fails when a page differs from its file.

Every benchmark that prints a table takes ``--results-dir DIR`` (default: ``$DPROBUST_RESULTS_DIR``, else
``results/``; tests pass a temporary folder) and ``--result-name NAME`` (another stem than the default, for a run
with other settings than the default table's).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shlex
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

RESULTS_DIR = Path(__file__).resolve().parent.parent / "results"
RESULTS_DIR_VARIABLE = "DPROBUST_RESULTS_DIR"
"""Environment variable naming another folder for result files (what ``--results-dir`` defaults to)."""


def add_results_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ``--results-dir DIR`` and ``--result-name NAME`` to a benchmark's parser."""
    parser.add_argument(
        "--results-dir",
        default=None,
        help=f"folder of the result files (default: ${RESULTS_DIR_VARIABLE}, else {RESULTS_DIR.name}/ of the repo)",
    )
    parser.add_argument(
        "--result-name",
        default=None,
        help="stem of the result file(s) instead of the default (use it when the settings differ from the default's)",
    )


def results_directory(directory: str | Path | None = None) -> Path:
    """``directory``, else ``$DPROBUST_RESULTS_DIR``, else the repository's ``results/``."""
    if directory is not None:
        return Path(directory)
    return Path(os.environ[RESULTS_DIR_VARIABLE]) if os.environ.get(RESULTS_DIR_VARIABLE) else RESULTS_DIR


def result_name(args: argparse.Namespace, default: str) -> str:
    """``--result-name`` if given, else ``default``."""
    return getattr(args, "result_name", None) or default


def slug(text: str) -> str:
    """``'resnet18/b64'`` -> ``'resnet18_b64'``: a setting as part of a result file's stem."""
    return "".join(char if char.isalnum() else "_" for char in str(text)).strip("_").lower()


def current_commit() -> str:
    """The checkout's commit, ``+dirty`` when tracked files differ from it, ``'unknown'`` outside a git checkout."""
    root = RESULTS_DIR.parent
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(["git", "diff", "--quiet", "HEAD"], cwd=root, capture_output=True).returncode != 0
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return commit + ("+dirty" if dirty else "")


def machine_description(device: str = "cpu") -> str:
    """``'Linux x86_64, 2 CPUs, torch 2.x, cpu (1 thread)'``: enough to know whether two files are comparable."""
    import torch

    threads = f" ({torch.get_num_threads()} thread{'s' * (torch.get_num_threads() != 1)})" if device == "cpu" else ""
    system = f"{platform.system()} {platform.machine()}, {os.cpu_count()} CPUs"
    return f"{system}, torch {torch.__version__}, {device}{threads}"


def write_result(
    name: str,
    *,
    title: str,
    columns: Sequence[str],
    rows: Sequence[Sequence[Any]],
    seeds: Sequence[int] = (),
    notes: str = "",
    raw: Mapping[str, Any] | None = None,
    device: str = "cpu",
    directory: str | Path | None = None,
) -> Path:
    """Write ``results/<name>.json`` (or ``directory/<name>.json``, see :func:`results_directory`); return its path.

    Raises:
        ValueError: if ``name`` is not a plain file stem or a row's length differs from ``columns``.
    """
    if not name or Path(name).name != name or name.startswith("."):
        raise ValueError(f"result name {name!r} must be a plain file stem such as 'dp_overhead_cpu'")
    bad_rows = [index for index, row in enumerate(rows) if len(row) != len(columns)]
    if bad_rows:
        raise ValueError(f"rows {bad_rows} of {name!r} do not have the {len(columns)} columns {list(columns)}")
    record = {
        "name": name,
        "title": title,
        "command": " ".join(shlex.quote(part) for part in [Path(sys.executable).name, *sys.argv]),
        "commit": current_commit(),
        "machine": machine_description(device),
        "date": datetime.datetime.now(datetime.UTC).replace(microsecond=0).isoformat(),
        "seeds": [int(seed) for seed in seeds],
        "columns": list(columns),
        "rows": [[str(cell) for cell in row] for row in rows],
        "notes": notes,
        "raw": dict(raw or {}),
    }
    target = results_directory(directory)
    target.mkdir(parents=True, exist_ok=True)
    path = target / f"{name}.json"
    path.write_text(json.dumps(record, indent=1, default=_plain) + "\n")
    print(f"wrote {path}", file=sys.stderr, flush=True)  # stderr: a benchmark's stdout is its printed report
    return path


def read_result(path: str | Path) -> dict[str, Any]:
    """A result file's record; raises ``ValueError`` naming the missing keys if it is not one."""
    record = json.loads(Path(path).read_text())
    required = {"name", "title", "command", "commit", "machine", "date", "seeds", "columns", "rows", "notes"}
    missing = sorted(required - set(record))
    if missing:
        raise ValueError(f"{path} is not a result file: it lacks {missing}; re-run the command that writes it")
    return record


def _plain(value: Any) -> Any:
    """JSON for numpy scalars and arrays, tuples and paths in ``raw``."""
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"{type(value).__name__} is not JSON serializable")
