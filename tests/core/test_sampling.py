"""Poisson sampling: rate, independence across ranks, determinism, empty batches."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import TensorDataset

from lightning_dprobust.callbacks.dp_randomness import DPRandomness
from lightning_dprobust.core import sampling
from lightning_dprobust.core.sampling import (
    EmptySafeCollate,
    PoissonBatchSampler,
    derive_key,
    derive_seed,
    keyed_generator,
)
from tests.helpers import seeded_by_32_bits


def test_batch_sizes_match_the_sample_rate():
    sampler = PoissonBatchSampler(2000, 0.05, steps_per_epoch=400, seed=1)
    sizes = torch.tensor([len(b) for b in sampler], dtype=torch.float)
    assert sizes.mean().item() == pytest.approx(100, rel=0.03)
    # binomial variance n q (1-q) = 95: a fixed-size sampler would have variance 0
    assert sizes.var().item() == pytest.approx(95, rel=0.25)


def test_each_example_is_included_with_probability_q():
    sampler = PoissonBatchSampler(50, 0.2, steps_per_epoch=3000, seed=2)
    counts = torch.zeros(50)
    for indices in sampler:
        counts[indices] += 1
    assert (counts / 3000).sub(0.2).abs().max() < 0.035


def test_ranks_partition_one_global_poisson_sample():
    full = list(PoissonBatchSampler(300, 0.1, seed=3))
    shards = [list(PoissonBatchSampler(300, 0.1, seed=3, rank=r, world_size=2)) for r in range(2)]
    assert len(shards[0]) == len(shards[1]) == len(full)
    for whole, a, b in zip(full, *shards, strict=True):
        assert sorted(a + b) == whole and not set(a) & set(b)


def test_masks_depend_on_seed_and_epoch_only():
    a, b = PoissonBatchSampler(100, 0.3, seed=4), PoissonBatchSampler(100, 0.3, seed=4)
    assert list(a) == list(b)
    b.set_epoch(1)
    assert list(a) != list(b)


def test_default_steps_per_epoch_is_one_over_q():
    assert len(PoissonBatchSampler(1000, 0.01)) == 100
    assert len(PoissonBatchSampler(1000, 1.0)) == 1


@pytest.mark.parametrize("kwargs", [{"sample_rate": 0.0}, {"sample_rate": 1.5}, {"num_examples": 0}])
def test_rejects_bad_arguments(kwargs):
    args = {"num_examples": 10, "sample_rate": 0.5} | kwargs
    with pytest.raises(ValueError):
        PoissonBatchSampler(**args)


def test_empty_batch_collates_to_zero_length_tensors_of_the_right_shape():
    data = TensorDataset(torch.rand(5, 1, 8, 8), torch.arange(5))
    collate = EmptySafeCollate(data)
    x, y = collate([])
    assert x.shape == (0, 1, 8, 8) and y.shape == (0,) and y.dtype == torch.int64
    x, y = collate([data[0], data[1]])
    assert x.shape == (2, 1, 8, 8)


def test_masks_ignore_the_global_rng_and_each_step_has_its_own_seed():
    torch.manual_seed(0)
    first = list(PoissonBatchSampler(200, 0.2, steps_per_epoch=5, seed=2**100 + 3))
    torch.manual_seed(1)
    torch.rand(1000)
    assert list(PoissonBatchSampler(200, 0.2, steps_per_epoch=5, seed=2**100 + 3)) == first
    assert len({derive_seed(9, "mask", 0, step) for step in range(1000)}) == 1000
    assert derive_seed(9, "mask", 0, 1) != derive_seed(10, "mask", 0, 1)


def test_a_resume_skips_exactly_the_trained_masks():
    full = list(PoissonBatchSampler(300, 0.1, steps_per_epoch=8, seed=5))
    resumed = PoissonBatchSampler(300, 0.1, steps_per_epoch=8, seed=5)
    resumed.resume_at(0, 3)
    assert list(resumed) == full[3:]


def test_torch_keeps_32_bits_of_a_cpu_seed_so_a_seeded_state_is_one_of_2_to_the_32():
    """The premise of keyed generators: on CPU, ``manual_seed(s)`` and ``manual_seed(s + 2**32)`` give the same stream,
    and every seeded state follows MT19937's initialization recurrence (what :func:`seeded_by_32_bits` checks)."""
    for seed in (0, 7, 2**40 + 7, derive_seed(2**100 + 3, "noise", 0)):
        generator = torch.Generator().manual_seed(seed)
        assert seeded_by_32_bits(generator)
        twin = torch.Generator().manual_seed(seed % 2**32)
        assert torch.equal(torch.rand(8, generator=generator), torch.rand(8, generator=twin))


def test_keyed_cpu_generators_take_their_whole_state_from_the_keys():
    """A keyed generator's state is not one of the 2^32 seeded ones; the same keys give the same stream, other keys
    (a different secret, counter or label) another."""
    keys = (2**100 + 3, "noise", 4)
    generator = keyed_generator("cpu", *keys)
    assert not seeded_by_32_bits(generator)
    first = torch.randn(64, generator=generator)
    assert torch.equal(torch.randn(64, generator=keyed_generator("cpu", *keys)), first)
    for other in ((2**100 + 4, "noise", 4), (2**100 + 3, "noise", 5), (2**100 + 3, "mask", 4)):
        assert not torch.equal(torch.randn(64, generator=keyed_generator("cpu", *other)), first)
    unkeyed = torch.Generator().manual_seed(derive_seed(*keys))
    assert not torch.equal(torch.randn(64, generator=unkeyed), first)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_keyed_cuda_generators_keep_the_whole_derived_seed():
    """CUDA's Philox generator keeps all 64 bits of its seed (unlike the CPU's), so a keyed CUDA generator is seeded
    with :func:`derive_seed`'s 63 bits: seeds equal in their low 32 bits give different streams, the same keys the
    same stream, other keys another."""
    low = torch.randn(64, device="cuda", generator=torch.Generator("cuda").manual_seed(7))
    high = torch.randn(64, device="cuda", generator=torch.Generator("cuda").manual_seed(7 + 2**40))
    assert not torch.equal(low, high)
    keys = (2**100 + 3, "noise", 4)
    generator = keyed_generator("cuda", *keys)
    assert generator.device.type == "cuda" and generator.initial_seed() == derive_seed(*keys)
    first = torch.randn(64, device="cuda", generator=generator)
    assert torch.equal(torch.randn(64, device="cuda", generator=keyed_generator("cuda", *keys)), first)
    other = keyed_generator("cuda", 2**100 + 4, "noise", 4)
    assert not torch.equal(torch.randn(64, device="cuda", generator=other), first)


def test_each_poisson_mask_is_drawn_from_its_keyed_generator():
    """The masks are those of :func:`keyed_generator` for (seed, "mask", epoch, step), not of a 32-bit seed."""
    sampler = PoissonBatchSampler(200, 0.2, steps_per_epoch=3, seed=2**100 + 3)
    sampler.set_epoch(2)
    for step, batch in enumerate(sampler):
        mask = torch.rand(200, generator=keyed_generator("cpu", 2**100 + 3, "mask", 2, step)) < 0.2
        assert batch == mask.nonzero().flatten().tolist()


def test_an_unexpected_generator_state_layout_is_refused_not_seeded_with_32_bits(monkeypatch):
    """If torch's CPU generator state were laid out differently (another torch), keying would fail closed: an error,
    never a silently 32-bit-seeded generator."""
    monkeypatch.setattr(sampling, "_MT_STATE_OFFSET", 32)
    with pytest.raises(RuntimeError, match="refusing to fall back to a 32-bit seed"):
        keyed_generator("cpu", 2**100 + 3, "noise", 0)


@pytest.mark.parametrize("seed", [None, 2**40 + 7])
def test_cpu_noise_comes_from_a_generator_keyed_by_the_whole_secret(seed):
    """A CPU generator seeded with ``manual_seed`` is one of 2^32 (torch keeps 32 bits of the seed): an attacker could
    search them for the stream that explains an update between two checkpoints. The noise generator of every step is
    keyed by the whole root instead (secret mode: 128 bits from the operating system)."""
    if seed is None:
        randomness = DPRandomness()
    else:
        with pytest.warns(UserWarning, match="reproducibility mode"):
            randomness = DPRandomness(seed=seed)
    randomness.start(trainer=type("Trainer", (), {"world_size": 1})())
    for step in (0, 1, 2**33):
        assert not seeded_by_32_bits(randomness.noise_generator(step, torch.device("cpu")))
    first = torch.randn(16, generator=randomness.noise_generator(3, torch.device("cpu")))
    assert torch.equal(torch.randn(16, generator=randomness.noise_generator(3, torch.device("cpu"))), first)
    assert not torch.equal(torch.randn(16, generator=randomness.noise_generator(4, torch.device("cpu"))), first)


def _seeded(seed: int) -> DPRandomness:
    with pytest.warns(UserWarning, match="reproducibility mode"):
        randomness = DPRandomness(seed=seed)
    randomness.start(trainer=type("Trainer", (), {"world_size": 1})())
    return randomness


def test_poisson_masks_are_keyed_by_the_whole_128_bit_root():
    """The masks' key is 128 bits derived from the whole root, as the noise's keys hold the root itself: two roots
    that differ only above bit 63 give different masks, and the key is not cut to a 63-bit seed."""
    low = 2**100 + 3
    roots = (low, low ^ (1 << 64), low ^ (1 << 127))  # equal in their low 64 bits
    masks = [list(PoissonBatchSampler(200, 0.2, steps_per_epoch=4, seed=_seeded(root).mask_seed())) for root in roots]
    assert masks[0] != masks[1] and masks[0] != masks[2] and masks[1] != masks[2]
    keys = [_seeded(root).mask_seed() for root in roots]
    assert keys == [derive_key(root, "masks", 0) for root in roots]
    assert max(key.bit_length() for key in keys) > 64  # a 63-bit seed never is
