"""TransDenoiser under DDP with 2 gloo processes: one sigma_bar per step for the global batch, identical replicas."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.helpers import run_ranks

SCRIPT = Path(__file__).with_name("transdenoiser_ddp_run.py")


@pytest.mark.slow
def test_two_ranks_share_sigma_bar_replicas_and_ledger(tmp_path):
    ranks = run_ranks(SCRIPT, tmp_path, 2, 32)
    assert ranks[0]["world_size"] == 2
    torch.testing.assert_close(ranks[0]["denoiser"], ranks[1]["denoiser"])  # noise added once, all-reduced
    torch.testing.assert_close(ranks[0]["classifier"], ranks[1]["classifier"])
    # sigma_bar comes from the all-reduced M and case counts: the same on both ranks, and only the last slice reduced
    torch.testing.assert_close(ranks[0]["multipliers"], ranks[1]["multipliers"])
    assert ranks[0]["multipliers"].shape == (3, 3)
    first, middle, last = ranks[0]["multipliers"].T
    assert bool((middle == 2.0).all()) and bool((first == 2.0).all()) and bool((last < 2.0).all())
    assert ranks[0]["ledger"] == ranks[1]["ledger"]
    history = ranks[0]["ledger"]["history"]  # each step at the smallest sigma_bar added: the last slice's
    assert [event[0] for event in history] == last.tolist()
    assert all(event[2] == 1 and abs(event[1] - 64 / 1293) < 1e-12 for event in history)  # 2 x 32 per step
