"""benchmarks/cli_startup.py: wall time of dprobust commands that do no work, README lines and docs pages."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "cli_startup.py"


def test_reports_each_command_and_the_entry_points_size(tmp_path):
    """The report's format and the result file; times vary, so only their form (median within min-max) is checked,
    while the counts are exact."""
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--commands=--help", "--repeats", "2", "--results-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    timed, readme, pages = done.stdout.splitlines()
    found = re.fullmatch(r"dprobust --help: (\d+\.\d\d) s \[(\d+\.\d\d)-(\d+\.\d\d)\]", timed)
    assert found, timed
    median, low, high = map(float, found.groups())
    assert low <= median <= high
    lines = len((ROOT / "README.md").read_text(encoding="utf-8").splitlines())
    assert readme == f"README.md lines: {lines}"
    site = [page for page in (ROOT / "docs").rglob("*.md") if "hooks" not in page.parts]
    assert pages == f"documentation pages (docs/**/*.md): {len(site)}"
    record = json.loads((tmp_path / "cli_startup.json").read_text())
    assert record["rows"][0][0] == "`dprobust --help`" and len(record["raw"]["seconds"]["--help"]) == 2


def test_a_failing_command_stops_the_benchmark_with_its_error(tmp_path):
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--commands", "no-such-command", "--repeats", "1"]
        + ["--results-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode != 0 and "`dprobust no-such-command` exited 2" in done.stderr
    assert not (tmp_path / "cli_startup.json").exists()
