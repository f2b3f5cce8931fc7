"""Seeded train/validation splits and patient-level (group) splits."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lightning_dprobust.data.splits import random_split_indices, split_dataset, split_groups, stratified_split_indices


@given(n=st.integers(1, 200), fraction=st.floats(0.0, 0.95), seed=st.integers(0, 2**32 - 1))
@settings(max_examples=50, deadline=None)
def test_random_split_partitions_the_indices(n, fraction, seed):
    if round(n * fraction) >= n:
        with pytest.raises(ValueError, match="leaves no training examples"):
            random_split_indices(n, fraction, seed)
        return
    train, val = random_split_indices(n, fraction, seed)
    assert len(val) == round(n * fraction)
    assert sorted(np.concatenate([train, val]).tolist()) == list(range(n))
    np.testing.assert_array_equal(random_split_indices(n, fraction, seed)[1], val)


def test_split_dataset_returns_subsets_of_the_dataset():
    train, val = split_dataset(list(range(10, 30)), 0.25, seed=0)
    assert len(val) == 5 and sorted([*train, *val]) == list(range(10, 30))


@given(
    sizes=st.lists(st.integers(1, 30), min_size=3, max_size=25),
    fractions=st.tuples(st.floats(0.05, 0.4), st.floats(0.05, 0.4)),
    seed=st.integers(0, 1000),
)
@settings(max_examples=60, deadline=None)
def test_group_split_keeps_groups_whole_and_meets_targets(sizes, fractions, seed):
    groups = np.repeat([f"p{k}" for k in range(len(sizes))], sizes)
    targets = [round(f * len(groups)) for f in fractions]
    try:
        parts = split_groups(groups.tolist(), targets, seed)
    except ValueError as err:
        assert "non-empty parts" in str(err)
        return
    assert sorted(np.concatenate(parts).tolist()) == list(range(len(groups)))
    owners = [set(groups[part]) for part in parts]
    assert all(not owners[a] & owners[b] for a in range(3) for b in range(a + 1, 3))
    for part, target in zip(parts[:2], targets, strict=True):
        assert target <= len(part) < target + max(sizes)
    for a, b in zip(parts, split_groups(groups.tolist(), targets, seed), strict=True):
        np.testing.assert_array_equal(a, b)


def test_group_split_order_depends_on_the_seed():
    groups = [f"p{k // 3}" for k in range(30)]
    splits = {tuple(split_groups(groups, [6, 9], seed)[0].tolist()) for seed in range(8)}
    assert len(splits) > 1


@pytest.mark.parametrize("seed", [0, 1])
def test_stratified_split_partitions_and_keeps_the_class_proportions(seed):
    labels = np.repeat(np.arange(4), [40, 20, 20, 20])
    train, val, test = stratified_split_indices(labels, 0.25, 0.2, seed)
    assert sorted(np.concatenate([train, val, test]).tolist()) == list(range(len(labels)))
    assert (len(test), len(val), len(train)) == (25, 15, 60)
    for part, size in ((train, 60), (val, 15), (test, 25)):
        np.testing.assert_allclose(np.bincount(labels[part], minlength=4) / size, [0.4, 0.2, 0.2, 0.2], atol=0.04)
    again = stratified_split_indices(labels, 0.25, 0.2, seed)
    assert all(np.array_equal(a, b) for a, b in zip((train, val, test), again, strict=True))
    assert not np.array_equal(np.sort(test), np.sort(stratified_split_indices(labels, 0.25, 0.2, seed + 7)[2]))


@pytest.mark.parametrize("key", ["test_fraction", "val_fraction"])
def test_stratified_split_rejects_fractions_outside_the_unit_interval(key):
    fractions = {"test_fraction": 0.2, "val_fraction": 0.1, key: 1.0}
    with pytest.raises(ValueError, match=f"{key} must lie in"):
        stratified_split_indices(np.arange(20) % 2, seed=0, **fractions)
