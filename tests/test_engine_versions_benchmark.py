"""benchmarks/engine_versions.py: two library versions' ghost steps against one non-private step, interleaved."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "engine_versions.py"


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=600)


def test_reports_each_variants_time_and_the_three_ratios_of_one_run(tmp_path):
    done = _run(
        "--new", str(ROOT), "--old", str(ROOT), "--cases", "cnn_tanh/b2", "--rounds", "2", "--steps", "1",
        "--results-dir", str(tmp_path),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    record = json.loads((tmp_path / "engine_versions_cpu.json").read_text())
    assert record["columns"][0] == "case" and [row[0] for row in record["rows"]] == ["cnn_tanh/b2"]
    line = done.stdout.strip().splitlines()[-1]
    assert line.startswith(f"cnn_tanh/b2 ({ROOT / 'lightning_dprobust' / '__init__.py'} vs ")
    ratios = re.findall(r"(new|old) / (non-DP|old) (\d+\.\d\d)x \[(\d+\.\d\d)-(\d+\.\d\d)\]", line)
    assert [(a, b) for a, b, *_ in ratios] == [("new", "non-DP"), ("old", "non-DP"), ("new", "old")]
    assert all(float(low) <= float(median) <= float(high) for *_, median, low, high in ratios)


def test_a_folder_without_the_package_is_refused_by_name(tmp_path):
    done = _run("--new", str(ROOT), "--old", str(tmp_path))
    assert done.returncode != 0 and f"--old {tmp_path} holds no lightning_dprobust/ package" in done.stderr
