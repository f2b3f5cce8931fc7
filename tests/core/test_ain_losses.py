"""AIN's losses on hand-made tensors (Eqs 5.1-5.6)."""

from __future__ import annotations

import pytest
import torch

from lightning_dprobust.core.ain_losses import (
    ain_loss,
    distance_loss,
    imitation_loss,
    misclassification_loss,
    targeted_margin,
    untargeted_margin,
)

LOGITS = torch.tensor([[1.0, 5.0, 3.0, 0.0], [2.0, -1.0, 0.5, 4.0]])


def test_distance_is_the_l2_norm_of_each_perturbation():
    p = torch.tensor([[[3.0, 4.0]], [[0.0, -2.0]]])
    assert distance_loss(p).tolist() == [5.0, 2.0]


def test_imitation_weights_the_image_and_logit_distances():
    adversarial, imitated = torch.tensor([[1.0, 1.0]]), torch.tensor([[1.0, 4.0]])
    logits, imitated_logits = torch.tensor([[0.0, 0.0]]), torch.tensor([[6.0, 8.0]])
    assert imitation_loss(adversarial, imitated, logits, imitated_logits, 2.0, 0.5).item() == pytest.approx(
        2.0 * 3.0 + 0.5 * 10.0
    )


def test_targeted_margin_is_best_other_minus_target():
    # target 2: example 0's best other class is 1 (5 - 3 = 2); example 1's is 3 (4 - 0.5 = 3.5)
    assert targeted_margin(LOGITS, 2).tolist() == [2.0, 3.5]
    # target 1 is already the winner of example 0: the margin is negative (3 - 5)
    assert targeted_margin(LOGITS, 1)[0].item() == -2.0


def test_untargeted_margin_is_true_minus_best_other():
    labels = torch.tensor([1, 0])
    # example 0: 5 - 3; example 1: 2 - 4 (already misclassified, negative)
    assert untargeted_margin(LOGITS, labels).tolist() == [2.0, -2.0]


def test_the_misclassification_loss_is_floored_at_minus_kappa_and_the_total_weights_its_terms():
    labels = torch.tensor([1, 0])
    assert misclassification_loss(LOGITS, labels, None, kappa=1.0).tolist() == [2.0, -1.0]
    assert misclassification_loss(LOGITS, labels, 1, kappa=10.0).tolist() == [-2.0, 5.0]
    total = ain_loss(torch.tensor([1.0]), torch.tensor([2.0]), torch.tensor([3.0]), 0.1, 0.2, 0.3)
    assert total.item() == pytest.approx(0.1 + 0.4 + 0.9)


def test_each_entry_depends_on_its_own_example_only():
    logits = LOGITS.clone().requires_grad_(True)
    gradient = torch.autograd.grad(untargeted_margin(logits, torch.tensor([1, 0]))[0], logits)[0]
    assert gradient[1].abs().sum() == 0 and gradient[0].abs().sum() > 0
