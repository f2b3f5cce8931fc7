"""benchmarks/check_cost.py: the periodic check's cost, one clipper alternating blocks with and without it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "check_cost.py"


def _module():
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        import check_cost
    finally:
        sys.path.remove(str(SCRIPT.parent))
    return check_cost


def test_each_checked_block_runs_exactly_one_check_and_the_unchecked_blocks_none():
    check_cost = _module()
    clipper, step = check_cost.private_steps("cnn_tanh/b2", 3)
    checks, verify = [], clipper._verify

    def counted(batch):
        checks.append(clipper.check_every)
        return verify(batch)

    clipper._verify = counted
    times = check_cost.measure(clipper, step, rounds=4, every=3)
    assert checks == [3, 3, 3, 3]  # one per checked block, none while check_every is None
    assert all(len(values) == 4 for values in times.values())


def test_the_script_writes_its_table_as_a_result_file(tmp_path):
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--cases", "cnn_tanh/b2", "--rounds", "2", "--every", "3"],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "DPROBUST_RESULTS_DIR": str(tmp_path)},
    )
    assert done.returncode == 0, done.stderr
    record = json.loads((tmp_path / "check_cost_cpu.json").read_text())
    (cells,) = record["rows"]
    assert cells[:2] == ["cnn_tanh", "2"] and cells[4].endswith("]")
    assert set(record["raw"]["cnn_tanh/b2"]) == {"checked", "unchecked"}
