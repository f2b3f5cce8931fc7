"""benchmarks/lightning_overhead.py: per-step time of Lightning fits with DPCallback against without, alternated."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "lightning_overhead.py"


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=600)


def test_reports_both_fits_times_and_the_ratio_over_the_pairs():
    """The report line's format, and that the ratio's median lies within its min-max (true of any timings); no time
    is compared with a value, since times vary from run to run."""
    done = _run("--cases", "cnn_tanh/b2", "--pairs", "2", "--steps", "2", "--warmup", "1")
    assert done.returncode == 0, done.stderr
    line = done.stdout.strip().splitlines()[-1]
    found = re.fullmatch(
        r"cnn_tanh/b2 \(ghost\): ms non-DP (\d+\.\d\d), DP (\d+\.\d\d); DP / non-DP (\d+\.\d\d)x "
        r"\[(\d+\.\d\d)-(\d+\.\d\d)\] over 2 pairs of fits",
        line,
    )
    assert found, line
    _, _, median, low, high = map(float, found.groups())
    assert low <= median <= high


def test_a_case_the_script_cannot_build_is_refused_by_name():
    done = _run("--cases", "token_bag/b64")
    assert done.returncode != 0 and "invalid choice: 'token_bag/b64'" in done.stderr
