"""benchmarks/lightning_overhead.py: per-step time of Lightning fits with DPCallback against without, alternated."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "lightning_overhead.py"


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=600)


def test_reports_both_fits_times_and_the_ratio_over_the_pairs(tmp_path):
    """The report line's format, and that the ratio's median lies within its min-max (true of any timings); no time
    is compared with a value, since times vary from run to run. The result file holds the same row."""
    done = _run(
        "--cases", "cnn_tanh/b2", "--pairs", "2", "--steps", "2", "--warmup", "1", "--results-dir", str(tmp_path)
    )
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
    record = json.loads((tmp_path / "lightning_overhead_ghost.json").read_text())
    plain, private = found.group(1), found.group(2)
    assert record["rows"] == [["cnn_tanh/b2", "ghost", plain, private, f"{median:.2f}x [{low:.2f}-{high:.2f}]", "2"]]


def test_busy_adds_each_fits_operator_time_and_count(tmp_path):
    """``--busy``: the operators' self time and ATen calls per step of one more fit of each kind. The private fit's step
    runs the clipper and the noise on top of the non-private step's operators, so it calls more ATen operators (an
    exact count, not a timing); times are only checked for their format. Batch 64 over 192 examples: a Poisson batch
    is empty with probability (2/3)^192 (an empty private step would call fewer operators), so the count cannot fail by
    chance as it could at batch 2."""
    done = _run(
        "--cases", "cnn_tanh/b64", "--pairs", "1", "--steps", "2", "--warmup", "1", "--busy",
        "--results-dir", str(tmp_path),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    found = re.search(
        r"; busy ms non-DP (\d+\.\d\d), DP (\d+\.\d\d): (\d+\.\d\d)x; ATen calls/step (\d+) vs (\d+)$",
        done.stdout.strip().splitlines()[-1],
    )
    assert found, done.stdout
    plain_calls, private_calls = int(found.group(4)), int(found.group(5))
    assert 0 < plain_calls < private_calls
    record = json.loads((tmp_path / "lightning_overhead_ghost.json").read_text())
    assert record["columns"][-2:] == ["ATen calls/step non-DP", "ATen calls/step DP"]
    assert record["rows"][0][-5:] == list(found.groups()[:2]) + [found.group(3) + "x", *found.groups()[3:]]


def test_busy_on_cuda_is_refused_before_any_fit():
    done = _run("--busy", "--accelerator", "cuda")
    assert done.returncode == 2 and "--busy measures the operators' CPU self time" in done.stderr


def test_a_case_the_script_cannot_build_is_refused_by_name():
    done = _run("--cases", "token_bag/b64")
    assert done.returncode != 0 and "invalid choice: 'token_bag/b64'" in done.stderr


def test_the_gpu_table_script_names_what_it_needs_without_a_gpu():
    """``benchmarks/gpu_table.sh`` refuses in one line on a machine without CUDA (CI), before running anything."""
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: the script would run the whole table")
    done = subprocess.run(
        ["bash", str(ROOT / "benchmarks" / "gpu_table.sh")],
        capture_output=True,
        text=True,
        timeout=300,
        env={"PYTHON": sys.executable, "PATH": "/usr/bin:/bin"},
    )
    assert done.returncode != 0
    assert done.stderr.strip().splitlines()[-1] == "no CUDA device: this script measures the GPU table"
