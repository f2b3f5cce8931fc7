"""benchmarks/sensitivity_table.py: the engines' sensitivity catalogue as the result file docs/dp_callback.md renders.

The catalogue is deterministic (seeded models and batches), so a fresh run must give the committed file's outcomes:
the same refusals, and every distance within 1e-3 C of the committed one. A change of an engine that moves a released
sum, or a refusal that disappears, fails here before the page can show stale numbers."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _outcome(cell: str) -> tuple[list[str], float | None]:
    parts = cell.split("; ")
    numbers = [float(part) for part in parts if not part.startswith("refused")]
    return [part for part in parts if part.startswith("refused")], (numbers[0] if numbers else None)


def test_a_fresh_run_gives_the_committed_catalogue(tmp_path):
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "sensitivity_table.py"), "--results-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    fresh = json.loads((tmp_path / "sensitivity_catalogue.json").read_text())
    committed = json.loads((ROOT / "results" / "sensitivity_catalogue.json").read_text())
    assert fresh["columns"] == committed["columns"]
    assert [row[:2] for row in fresh["rows"]] == [row[:2] for row in committed["rows"]]
    for new, old in zip(fresh["rows"], committed["rows"], strict=True):
        (new_refusals, new_distance), (old_refusals, old_distance) = _outcome(new[2]), _outcome(old[2])
        assert new_refusals == old_refusals, (new, old)
        assert (new_distance is None) == (old_distance is None), (new, old)
        if new_distance is not None:
            assert abs(new_distance - old_distance) <= 1e-3, (new, old)
