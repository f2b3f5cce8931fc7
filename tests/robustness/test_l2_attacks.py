"""The L2 attack harness of TransDenoiser's evaluation: budget, box, per-example independence, and that it attacks."""

from __future__ import annotations

import pytest
import torch

from lightning_dprobust import zoo
from lightning_dprobust.data import DigitsDataModule
from lightning_dprobust.robustness.l2_attacks import L2_METHODS, l2_attack


@pytest.fixture(scope="module")
def classifier_and_batch():
    data = DigitsDataModule()
    data.setup("test")
    x, y = data.test_set.tensors
    return zoo.load("mlp_tanh.erm_digits"), x[:64], y[:64]


@pytest.mark.parametrize("method", L2_METHODS)
def test_stays_in_the_ball_and_the_box_and_lowers_accuracy(classifier_and_batch, method):
    model, x, y = classifier_and_batch
    x_adv = l2_attack(model, x, y, eps=1.0, method=method, generator=torch.Generator().manual_seed(0))
    norms = torch.linalg.vector_norm((x_adv - x).flatten(1), dim=1)
    assert bool((norms <= 1.0 + 1e-6).all()) and bool((x_adv >= 0).all()) and bool((x_adv <= 1).all())
    with torch.no_grad():
        clean = (model(x).argmax(1) == y).float().mean()
        adversarial = (model(x_adv).argmax(1) == y).float().mean()
    assert adversarial < clean - 0.1
    assert not model.training


def test_one_examples_perturbation_depends_on_it_alone(classifier_and_batch):
    model, x, y = classifier_and_batch
    full = l2_attack(model, x[:8], y[:8], eps=0.5, method="MIM")
    x2 = x[:8].clone()
    x2[3] = torch.rand_like(x2[3])
    changed = l2_attack(model, x2, y[:8], eps=0.5, method="MIM")
    keep = [0, 1, 2, 4, 5, 6, 7]
    torch.testing.assert_close(full[keep], changed[keep])


def test_bad_arguments_are_refused(classifier_and_batch):
    model, x, y = classifier_and_batch
    with pytest.raises(ValueError, match="method"):
        l2_attack(model, x, y, eps=1.0, method="CW")
    with pytest.raises(ValueError, match="steps"):
        l2_attack(model, x, y, eps=1.0, steps=0)
