"""DDP with 2 gloo processes on CPU: replicas stay identical, share one secret Poisson mask per step
and the epsilon equals the single-process run."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.helpers import run_ranks

SCRIPT = Path(__file__).with_name("ddp_run.py")


def launch(out_dir: Path, devices: int, batch_size: int, *extra: str) -> list[dict]:
    out_dir.mkdir()
    return run_ranks(SCRIPT, out_dir, devices, batch_size, *extra)


@pytest.mark.parametrize(("engine", "clipper"), [("vmap", "PerExampleClipper"), ("ghost", "GhostClipper")])
def test_two_ranks_keep_identical_replicas_and_account_like_one_process(tmp_path, engine, clipper):
    ranks = launch(tmp_path / "ddp", 2, 64, engine)
    single = launch(tmp_path / "single", 1, 128, engine)[0]

    assert ranks[0]["world_size"] == 2
    assert ranks[0]["clipper"] == ranks[1]["clipper"] == single["clipper"] == clipper
    assert torch.equal(ranks[0]["params"], ranks[1]["params"])
    assert ranks[0]["ledger"] == ranks[1]["ledger"]
    assert ranks[0]["sample_rate"] == single["sample_rate"] == 128 / 1293
    assert ranks[0]["steps"] == single["steps"]
    assert ranks[0]["epsilon"] == single["epsilon"] > 0
    assert not torch.equal(ranks[0]["params"], ranks[0]["initial"])
    # each rank draws a secret from the OS; rank 0's is broadcast, so the shards interleave one global mask per step
    for first, second in zip(ranks[0]["first_epoch_batches"], ranks[1]["first_epoch_batches"], strict=True):
        union = sorted(first + second)
        assert (union[0::2], union[1::2]) == (first, second)


def test_noise_is_added_once_for_the_global_batch(tmp_path):
    """Constant losses make the clipped sum exactly zero on either engine, so one engine covers this noise test."""
    ranks = launch(tmp_path / "ddp", 2, 64, "auto", "zero")
    torch.testing.assert_close(ranks[0]["grads"], ranks[1]["grads"], rtol=0, atol=0)
    noise_on_sum = ranks[0]["grads"] * ranks[0]["sample_rate"] * 1293
    # once: std = sigma * C = 1.2; added on both ranks it would be 1.2 * sqrt(2) = 1.7
    assert abs(noise_on_sum.std().item() - 1.2) < 0.05
