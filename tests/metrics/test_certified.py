"""Tests of CertifiedAccuracy and AverageCertifiedRadius against plain-Python references over several batches."""

from __future__ import annotations

import doctest
import math

import pytest
import torch

from lightning_dprobust.metrics import AverageCertifiedRadius, CertifiedAccuracy, certified, certified_accuracy

RADII = (0.0, 0.25, 0.5, 0.75)


def reference_certified_accuracy(rows, radii):
    return [sum(p == t and p != -1 and r >= level for p, r, t in rows) / len(rows) for level in radii]


def reference_acr(rows):
    return sum(r if p == t and p != -1 else 0.0 for p, r, t in rows) / len(rows)


def random_batches(seed, num_batches=4, num_classes=4):
    """Certificates as Smooth.certify returns them: abstentions (-1) carry radius 0."""
    gen = torch.Generator().manual_seed(seed)
    batches = []
    for _ in range(num_batches):
        size = int(torch.randint(1, 40, (1,), generator=gen))
        targets = torch.randint(0, num_classes, (size,), generator=gen)
        predictions = torch.randint(-1, num_classes, (size,), generator=gen)
        radius = torch.rand(size, generator=gen, dtype=torch.float64) * 1.2
        radius[predictions == -1] = 0.0
        radius[:2] = torch.tensor([0.25, 0.5], dtype=torch.float64)[: min(2, size)]  # radii exactly at a level
        batches.append((predictions, radius, targets))
    return batches


def rows_of(batches):
    return [(int(p), float(r), int(t)) for batch in batches for p, r, t in zip(*batch, strict=True)]


@pytest.mark.parametrize("seed", range(5))
def test_matches_reference_over_batches(seed):
    batches = random_batches(seed)
    accuracy, acr = CertifiedAccuracy(RADII), AverageCertifiedRadius()
    for batch in batches:
        accuracy.update(*batch)
        acr.update(*batch)
    rows = rows_of(batches)
    assert accuracy.compute().tolist() == pytest.approx(reference_certified_accuracy(rows, RADII), abs=1e-6)
    assert acr.compute().item() == pytest.approx(reference_acr(rows), rel=1e-6)
    assert certified_accuracy(*(torch.cat(parts) for parts in zip(*batches, strict=True)), radii=RADII).tolist() == (
        pytest.approx(accuracy.compute().tolist())
    )


def test_abstain_never_counts_even_if_the_target_is_minus_one():
    predictions = torch.tensor([-1, -1, 3])
    radius = torch.tensor([0.0, 0.9, 0.9])
    targets = torch.tensor([-1, 2, 3])
    assert CertifiedAccuracy(radii=(0.0, 0.5))(predictions, radius, targets).tolist() == pytest.approx([1 / 3, 1 / 3])
    assert AverageCertifiedRadius()(predictions, radius, targets).item() == pytest.approx(0.9 / 3)


def test_all_abstain_and_radius_boundaries():
    metric = CertifiedAccuracy(radii=(0.0, 0.5, 0.5000001))
    metric.update(torch.tensor([1, -1]), torch.tensor([0.5, 0.0]), torch.tensor([1, 1]))
    assert metric.compute().tolist() == [0.5, 0.5, 0.0]  # radius >= r is inclusive
    assert CertifiedAccuracy()(torch.full((3,), -1), torch.zeros(3), torch.zeros(3, dtype=torch.long)).sum() == 0


def test_merging_two_ranks_equals_one_computation():
    batches = random_batches(11, num_batches=6)
    for cls in (lambda: CertifiedAccuracy(RADII), AverageCertifiedRadius):
        single, rank0, rank1 = cls(), cls(), cls()
        for i, batch in enumerate(batches):
            single.update(*batch)
            (rank0 if i % 2 else rank1).update(*batch)
        rank0.merge_state(rank1)
        torch.testing.assert_close(rank0.compute(), single.compute())


def test_reset_and_empty_compute():
    metric = CertifiedAccuracy(radii=(0.0,))
    metric.update(torch.tensor([1]), torch.tensor([0.3]), torch.tensor([1]))
    metric.reset()
    with pytest.warns(UserWarning):
        assert math.isnan(metric.compute().item())


def test_traits():
    for metric in (CertifiedAccuracy(), AverageCertifiedRadius()):
        assert metric.higher_is_better and not metric.is_differentiable and not metric.full_state_update
        assert all(fx == "sum" or fx.__name__ == "dim_zero_sum" for fx in metric._reductions.values())


@pytest.mark.parametrize("radii", [(), (-0.1,), (float("inf"),), (float("nan"), 0.0)])
def test_rejects_bad_radii(radii):
    with pytest.raises(ValueError, match="radii"):
        CertifiedAccuracy(radii=radii)


def test_rejects_mismatched_shapes_and_integer_radius():
    with pytest.raises(ValueError, match="1-D tensors of equal length"):
        CertifiedAccuracy().update(torch.tensor([1, 2]), torch.tensor([0.1]), torch.tensor([1, 2]))
    with pytest.raises(TypeError, match="floating-point"):
        AverageCertifiedRadius().update(torch.tensor([1]), torch.tensor([1]), torch.tensor([1]))


def test_docstring_examples():
    assert doctest.testmod(certified, raise_on_error=False).failed == 0
