"""benchmarks/dp_overhead.py: the engines' step time against non-private training, interleaved in one run."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "dp_overhead.py"


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=600)


def test_the_check_cost_modes_run_and_report_a_ratio_per_mode():
    """``ghost-unchecked`` (the check against vmap only at the first step) and ``ghost+probe`` build and step, and
    ``--per-round mean`` is reported; each ratio's median lies within its min-max (true of any timings): no time is
    compared with a value."""
    done = _run(
        "--cases", "cnn_tanh/b2", "--modes", "non-DP", "ghost", "ghost-unchecked", "ghost+probe",
        "--rounds", "2", "--steps", "2", "--per-round", "mean",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "(mean per round)" in done.stdout
    for mode in ("ghost", "ghost-unchecked", "ghost+probe"):
        row = next(line for line in done.stdout.splitlines() if f"| {mode} |" in line)
        found = re.search(r"\| (\d+\.\d\d)x \[(\d+\.\d\d)-(\d+\.\d\d)\] \|", row)
        assert found, row
        median, low, high = map(float, found.groups())
        assert low <= median <= high
    cost = re.search(r"cnn_tanh/b2: ghost / ghost-unchecked (\d+\.\d\d)x \[(\d+\.\d\d)-(\d+\.\d\d)\]", done.stdout)
    assert cost, done.stdout


def test_the_unchecked_mode_differs_from_ghost_only_in_its_check_schedule():
    """The mode the check's cost is measured against checks against vmap only at its first step; ``ghost`` is the
    engine ``DPCallback`` builds, with its periodic check and without the opt-in probe."""
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        import dp_overhead
    finally:
        sys.path.remove(str(SCRIPT.parent))
    from lightning_dprobust.core.ghost import CHECK_EVERY, GhostClipper
    from lightning_dprobust.methods import DPSGD

    module = DPSGD(model="cnn_tanh", num_classes=10, input_shape=(1, 28, 28))
    engines = {mode: dp_overhead.build_engine(module, mode) for mode in ("ghost", "ghost-unchecked", "ghost+probe")}
    assert all(isinstance(engine, GhostClipper) for engine in engines.values())
    assert (engines["ghost"].check_every, engines["ghost"].probe) == (CHECK_EVERY, False)
    assert (engines["ghost-unchecked"].check_every, engines["ghost-unchecked"].probe) == (None, False)
    assert (engines["ghost+probe"].check_every, engines["ghost+probe"].probe) == (CHECK_EVERY, True)
