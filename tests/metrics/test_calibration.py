"""Calibration metrics against hand-computed examples."""

from __future__ import annotations

import pytest
import torch
from torchmetrics.classification import MulticlassCalibrationError

from lightning_dprobust.metrics import PaperCalibrationError


def probs_of(confidences, predicted):
    """Two-class probabilities with the given max confidence on the given class."""
    conf = torch.tensor(confidences)
    first = torch.where(torch.tensor(predicted) == 0, conf, 1 - conf)
    return torch.stack([first, 1 - first], dim=1)


def test_paper_ece_hand_computed():
    # bin 18 (0.90-0.95, centre 0.925): 3 examples, 2 correct -> acc 2/3, gap |0.925 - 0.6667| = 0.25833
    # bin 14 (0.70-0.75, centre 0.725): 2 examples, 2 correct -> acc 1, gap 0.275
    # bin 12 (0.60-0.65): 1 example, wrong -> acc 0, dropped; confidence exactly 0.80 sits on a bound, excluded
    probs = probs_of([0.91, 0.93, 0.94, 0.71, 0.74, 0.61, 0.80], [0, 0, 1, 1, 0, 0, 0])
    targets = torch.tensor([0, 0, 0, 1, 0, 1, 1])
    ece, mce = PaperCalibrationError(), PaperCalibrationError(norm="max")
    ece.update(probs, targets)
    mce.update(probs, targets)
    assert ece.compute().item() == pytest.approx((0.925 - 2 / 3 + 0.275) / 2, abs=1e-6)
    assert mce.compute().item() == pytest.approx(0.275, abs=1e-6)
    assert mce.compute() >= ece.compute()


def test_standard_ece_single_bin_is_the_gap_between_accuracy_and_confidence():
    probs = probs_of([0.8, 0.8, 0.8, 0.8, 0.8], [0, 0, 0, 0, 0])
    targets = torch.tensor([0, 0, 0, 1, 1])  # accuracy 0.6, confidence 0.8
    metric = MulticlassCalibrationError(num_classes=2, n_bins=15, norm="l1")
    assert metric(probs, targets).item() == pytest.approx(0.2, abs=1e-6)


def test_split_updates_equal_one_update():
    generator = torch.Generator().manual_seed(0)
    probs = torch.rand(300, 4, generator=generator).softmax(1)
    targets = torch.randint(0, 4, (300,), generator=generator)
    whole, parts = PaperCalibrationError(), PaperCalibrationError()
    whole.update(probs, targets)
    parts.update(probs[:100], targets[:100])
    parts.update(probs[100:], targets[100:])
    torch.testing.assert_close(whole.compute(), parts.compute())
