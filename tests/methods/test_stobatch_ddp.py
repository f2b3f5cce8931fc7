"""Distributed StoBatch (Alg. 4) with 2 gloo processes: the same noise draws (one input draw per fixed batch) and
batch partition on every rank, each fixed batch owned by one rank alone, averaged gradients keep the replicas
identical, the same nominal epsilon."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.helpers import run_ranks


def _launch(out_dir: Path, devices: int) -> list[dict]:
    out_dir.mkdir()
    return run_ranks(Path(__file__).with_name("stobatch_ddp_run.py"), out_dir, devices)


@pytest.mark.slow
def test_two_gloo_ranks_share_the_noise_own_disjoint_batches_and_stay_identical(tmp_path):
    first, second = _launch(tmp_path / "ddp", 2)
    assert first["world_size"] == 2
    assert torch.equal(first["noise"], second["noise"]) and torch.equal(first["batches"], second["batches"])
    assert torch.equal(first["params"], second["params"])
    assert not torch.equal(first["params"], first["initial"])
    mine = {index for batch in first["served"] for index in batch}
    theirs = {index for batch in second["served"] for index in batch}
    assert mine and theirs and not mine & theirs  # each fixed batch belongs to one trainer
    assert len(first["served"]) == len(second["served"]) == len(first["batches"]) // 2 // 2
    assert first["steps"] == 2 * len(first["served"])  # the same pairs in both epochs
    assert first["epsilon"] == second["epsilon"] == 2.0  # nominal
    assert len(first["noise"]) == len(first["batches"]) * 64 + 16 * 4 * 4
