"""Tests of RobustAccuracy against a plain-Python reference over several batches."""

from __future__ import annotations

import doctest

import pytest
import torch

from lightning_dprobust.metrics import RobustAccuracy, robust, robust_accuracy


def reference_accuracy(preds, targets):
    return sum(p == t and p != -1 for p, t in zip(preds, targets, strict=True)) / len(targets)


@pytest.mark.parametrize("seed", range(4))
def test_matches_reference_with_logits_and_indices(seed):
    gen = torch.Generator().manual_seed(seed)
    metric, all_preds, all_targets = RobustAccuracy(), [], []
    for step in range(5):
        size = int(torch.randint(1, 30, (1,), generator=gen))
        targets = torch.randint(0, 6, (size,), generator=gen)
        logits = torch.randn(size, 6, generator=gen)
        preds = logits.argmax(1) if step % 2 else logits
        metric.update(preds, targets)
        all_preds += logits.argmax(1).tolist()
        all_targets += targets.tolist()
    assert metric.compute().item() == pytest.approx(reference_accuracy(all_preds, all_targets), abs=1e-6)
    assert robust_accuracy(torch.tensor(all_preds), torch.tensor(all_targets)) == pytest.approx(metric.compute())


def test_abstain_is_wrong_and_ranks_merge():
    rank0, rank1, single = RobustAccuracy(), RobustAccuracy(), RobustAccuracy()
    batches = [(torch.tensor([-1, 2, 1]), torch.tensor([-1, 2, 0])), (torch.tensor([[0.1, 0.9]]), torch.tensor([1]))]
    for metric, batch in ((rank0, batches[0]), (rank1, batches[1])):
        metric.update(*batch)
        single.update(*batch)
    rank0.merge_state(rank1)
    assert rank0.compute().item() == single.compute().item() == pytest.approx(2 / 4)


def test_rejects_bad_shapes():
    with pytest.raises(ValueError, match="class indices"):
        RobustAccuracy().update(torch.tensor([0.2, 0.8]), torch.tensor([1, 0]))
    with pytest.raises(ValueError, match="class indices"):
        RobustAccuracy().update(torch.tensor([1, 0]), torch.tensor([1]))


def test_docstring_examples():
    assert doctest.testmod(robust, raise_on_error=False).failed == 0
