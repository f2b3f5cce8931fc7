"""What a newcomer waits for: the wall time of ``dprobust`` commands that do no work, and the size of the entry points.

Each command in ``--commands`` runs ``--repeats`` times as a fresh process (``dprobust`` of the current Python's
environment, or ``python -m lightning_dprobust.cli.main`` where no ``dprobust`` script is installed), and its wall time
from start to exit is reported as the median [min-max]; the first, untimed run warms the file cache. The same result
file counts the README's lines and the documentation site's pages (Markdown files under ``docs/``, the generated CLI
and API reference pages included as the site builds them).

Usage: ``python benchmarks/cli_startup.py [--commands "zoo list" "fit --help"] [--repeats 5]`` (default: the three
commands ``--help``, ``zoo list``, ``fit --help``; a lone command that starts with ``--`` is given as
``--commands=--help``).
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from results import add_results_arguments, result_name, write_result

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_COMMANDS = ("--help", "zoo list", "fit --help")
HEADER = ("what", "value")


def dprobust() -> list[str]:
    """The command that starts ``dprobust`` in this Python's environment."""
    script = Path(sys.executable).with_name("dprobust")
    if script.is_file():
        return [str(script)]
    found = shutil.which("dprobust")
    return [found] if found else [sys.executable, "-m", "lightning_dprobust.cli.main"]


def seconds(arguments: str, repeats: int) -> list[float]:
    """Wall seconds of ``repeats`` runs of ``dprobust <arguments>`` after one untimed run; each must exit 0."""
    command = [*dprobust(), *shlex.split(arguments)]
    times = []
    for index in range(repeats + 1):
        start = time.perf_counter()
        done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT)
        elapsed = time.perf_counter() - start
        if done.returncode != 0:
            raise SystemExit(f"`dprobust {arguments}` exited {done.returncode}: {done.stderr.strip()[-500:]}")
        if index:
            times.append(elapsed)
    return times


def median_range(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} s [{min(values):.2f}-{max(values):.2f}]"


def readme_lines() -> int:
    return len((ROOT / "README.md").read_text(encoding="utf-8").splitlines())


def docs_pages() -> int:
    """Markdown pages of the site: the files under ``docs/`` (the CLI reference and the API pages are among them)."""
    return sum(1 for page in (ROOT / "docs").rglob("*.md") if "hooks" not in page.parts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--commands", nargs="+", default=list(DEFAULT_COMMANDS), help="dprobust arguments, each quoted")
    parser.add_argument("--repeats", type=int, default=5, help="timed runs per command (median taken)")
    add_results_arguments(parser)
    args = parser.parse_args()
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    rows, raw = [], {}
    load = os.getloadavg()[0]  # other jobs on the machine slow the imports down: the caption says how busy it was
    for arguments in args.commands:
        raw[arguments] = seconds(arguments, args.repeats)
        rows.append([f"`dprobust {arguments}`", median_range(raw[arguments])])
        print(f"dprobust {arguments}: {rows[-1][1]}", flush=True)
    rows += [["README.md lines", str(readme_lines())], ["documentation pages (docs/**/*.md)", str(docs_pages())]]
    for what, value in rows[-2:]:
        print(f"{what}: {value}")
    write_result(
        result_name(args, "cli_startup"),
        title="Time to a first answer, and the size of the entry points",
        columns=HEADER,
        rows=rows,
        notes=f"each command {args.repeats} times as a fresh process after one untimed run, wall time from start to "
        f"exit, median [min-max]; 1-minute load average {load:.1f} on {os.cpu_count()} CPUs when the run started",
        raw={"seconds": raw},
        directory=args.results_dir,
    )


if __name__ == "__main__":
    main()
