"""AIN under DDP with 2 gloo processes: one validation success rate for both ranks, one bound, identical replicas."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.helpers import run_ranks

SCRIPT = Path(__file__).with_name("ain_ddp_run.py")


@pytest.mark.slow
def test_two_ranks_share_the_bound_the_controller_and_the_generator(tmp_path):
    ranks = run_ranks(SCRIPT, tmp_path, 2)
    assert ranks[0]["world_size"] == 2
    torch.testing.assert_close(ranks[0]["generator"], ranks[1]["generator"])  # gradients all-reduced
    torch.testing.assert_close(ranks[0]["target"], ranks[1]["target"])
    assert len(ranks[0]["success"]) == 2 and ranks[0]["success"] == ranks[1]["success"]  # reduced over ranks
    assert ranks[0]["controller"] == ranks[1]["controller"] and ranks[0]["bound"] == ranks[1]["bound"]
    assert ranks[0]["bound"] < 0.8 or ranks[0]["controller"]["rate"] != -0.3  # the controller acted
    assert 0 < ranks[0]["imitated"] <= 2 * 3 * 16  # each rank attacks only the examples it saw, once each
