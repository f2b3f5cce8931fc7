"""TransDenoiser under DDP with 2 gloo processes: one sigma_bar per step for the global batch, identical replicas."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).with_name("transdenoiser_ddp_run.py")
ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_two_ranks_share_sigma_bar_replicas_and_ledger(tmp_path):
    env = os.environ | {"PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    command = [sys.executable, str(SCRIPT), str(tmp_path), "2", "32"]
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]
    ranks = [torch.load(tmp_path / f"rank{rank}.pt", weights_only=True) for rank in range(2)]
    assert ranks[0]["world_size"] == 2
    torch.testing.assert_close(ranks[0]["denoiser"], ranks[1]["denoiser"])  # noise added once, all-reduced
    torch.testing.assert_close(ranks[0]["classifier"], ranks[1]["classifier"])
    # sigma_bar comes from the all-reduced M and case counts: the same on both ranks, and only the last slice reduced
    torch.testing.assert_close(ranks[0]["multipliers"], ranks[1]["multipliers"])
    assert ranks[0]["multipliers"].shape == (3, 3)
    first, middle, last = ranks[0]["multipliers"].T
    assert bool((middle == 2.0).all()) and bool((first == 2.0).all()) and bool((last < 2.0).all())
    assert ranks[0]["ledger"] == ranks[1]["ledger"]
    (steps,) = ranks[0]["ledger"]["history"]
    assert steps[0] == 2.0 and steps[2] == 3 and abs(steps[1] - 64 / 1293) < 1e-12  # 2 x 32 per step
