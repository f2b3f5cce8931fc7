"""Render the docs' tables from the result files: nobody types a measured number.

Every docs page (``docs/**/*.md`` and ``README.md``) may hold, any number of times, each marker on a line of its own::

    <!-- results:NAME -->
    ...
    <!-- /results:NAME -->

Everything between the two markers is replaced by the table of ``results/NAME.json`` (written by the benchmark
that measured it, see ``benchmarks/results.py``) and a one-line caption: the title, the seeds, the notes, and the
command, commit, date and machine the file came from.

Usage: ``python benchmarks/render_results.py`` (``make results``) rewrites the pages; ``--check`` rewrites nothing
and exits with status 1, naming each page and table that differs from its file, each marker whose file is missing
and each marker left open (``tests/test_results_render.py`` runs it). ``--root`` and ``--results-dir`` point it
at another tree.
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from lightning_dprobust.robustness.reports import markdown_table
from results import read_result

ROOT = Path(__file__).resolve().parents[1]
OPEN = re.compile(r"^<!-- results:(?P<name>[A-Za-z0-9_.-]+) -->$", re.M)
BLOCK = re.compile(
    r"^(?P<open><!-- results:(?P<name>[A-Za-z0-9_.-]+) -->)$(?P<body>.*?)^(?P<close><!-- /results:(?P=name) -->)$",
    re.S | re.M,
)
"""A marker is a line of its own (a marker quoted inside a sentence, as in these docs' own explanation, is text)."""


@dataclass(frozen=True)
class Problem:
    """One page's table that does not match its file (``stale``), has no file (``missing``) or no end (``open``)."""

    page: str
    name: str
    kind: str

    def __str__(self) -> str:
        if self.kind == "stale":
            return f"{self.page}: table '{self.name}' differs from results/{self.name}.json (run: make results)"
        if self.kind == "missing":
            return (
                f"{self.page}: marker 'results:{self.name}' has no file results/{self.name}.json (run the benchmark "
                "that writes it, or remove the marker)"
            )
        return f"{self.page}: marker 'results:{self.name}' is never closed (add <!-- /results:{self.name} -->)"


def pages(root: Path) -> list[Path]:
    """The docs pages of a tree: ``docs/**/*.md`` and ``README.md``, in a fixed order."""
    found = sorted((root / "docs").rglob("*.md")) if (root / "docs").is_dir() else []
    readme = root / "README.md"
    return found + ([readme] if readme.is_file() else [])


def _seeds(seeds: list[int]) -> str:
    if not seeds:
        return "no seeds"
    return f"seed {seeds[0]}" if len(seeds) == 1 else f"seeds {', '.join(map(str, seeds))}"


def caption(record: dict) -> str:
    """One line: title, seeds, notes, then where the numbers come from."""
    title, notes = record["title"].rstrip("."), record["notes"].strip().rstrip(".")
    notes = notes[:1].upper() + notes[1:]
    commit = record["commit"]
    commit = commit[:12] + ("+dirty" if commit.endswith("+dirty") else "") if commit != "unknown" else commit
    source = (
        f"`results/{record['name']}.json`, written by `{record['command']}` at commit `{commit}` on "
        f"{record['date'][:10]} ({record['machine']})"
    )
    return f"*{title}* ({_seeds(record['seeds'])}){f'. {notes}' if notes else ''}. Source: {source}."


def render(record: dict) -> str:
    """What goes between a table's markers: blank line, table, blank line, caption, blank line."""
    table = markdown_table(record["columns"], record["rows"])
    return f"\n\n{table}\n\n{caption(record)}\n\n"


def render_page(text: str, page: str, results_dir: Path) -> tuple[str, list[Problem]]:
    """``text`` with every marked table rendered from its file, and the problems found on the way."""
    problems, closed = [], set()

    def replace(match: re.Match) -> str:
        name = match["name"]
        closed.add(match.start())
        path = results_dir / f"{name}.json"
        if not path.is_file():
            problems.append(Problem(page, name, "missing"))
            return match[0]
        body = render(read_result(path))
        if body != match["body"]:
            problems.append(Problem(page, name, "stale"))
        return match["open"] + body + match["close"]

    rendered = BLOCK.sub(replace, text)
    problems += [Problem(page, m["name"], "open") for m in OPEN.finditer(text) if m.start() not in closed]
    return rendered, problems


def run(root: Path, results_dir: Path, check: bool) -> list[Problem]:
    """Render (or, with ``check``, compare) every page of ``root``; return the problems (stale ones are fixed unless
    ``check``)."""
    problems = []
    for path in pages(root):
        text = path.read_text()
        rendered, found = render_page(text, str(path.relative_to(root)), results_dir)
        problems += found
        if not check and rendered != text:
            path.write_text(rendered)
            print(f"rendered {path.relative_to(root)}", flush=True)
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if a page differs from its files")
    parser.add_argument("--root", type=Path, default=ROOT, help="tree holding docs/ and README.md (default: the repo)")
    parser.add_argument("--results-dir", type=Path, default=None, help="result files (default: <root>/results)")
    args = parser.parse_args(argv)
    problems = run(args.root, args.results_dir or args.root / "results", args.check)
    if not args.check:
        problems = [problem for problem in problems if problem.kind != "stale"]  # those were just rendered
    for problem in problems:
        print(problem, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
