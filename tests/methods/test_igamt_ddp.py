"""IGAMT under DDP with 2 gloo processes: one global Poisson sample and one noise draw per release, identical
replicas, one ledger."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.helpers import run_ranks

SCRIPT = Path(__file__).with_name("igamt_ddp_run.py")


@pytest.mark.slow
def test_two_ranks_stay_identical_and_share_the_ledger(tmp_path):
    ranks = run_ranks(SCRIPT, tmp_path, 2)
    assert ranks[0]["world_size"] == 2
    torch.testing.assert_close(ranks[0]["params"], ranks[1]["params"])  # noise drawn once, sums all-reduced
    assert ranks[0]["ledger"] == ranks[1]["ledger"]
    (event,) = ranks[0]["ledger"]["history"]
    # 2 x 4 per step of 32 records: q = 0.25, 4 steps; critics, Enc and Dec released each step: sigma / sqrt(3)
    assert event[1] == 0.25 and event[2] == ranks[0]["iterations"] == 4
    assert abs(event[0] - 3**-0.5) < 1e-12
