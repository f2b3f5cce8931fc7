"""DP-CERT: views, per-example losses without cross-example terms, and DP-SGD accounting."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from lightning_dprobust.callbacks import DPCallback
from lightning_dprobust.core.per_sample import PerExampleClipper
from lightning_dprobust.methods import DPSGD, DPCert
from tests.helpers import digits, quiet_trainer

VARIANTS = [
    {"augmentation": "gaussian"},
    {"augmentation": "gaussian", "regularizer": "stability"},
    {"augmentation": "gaussian", "regularizer": "macer", "macer_gamma": 10.0},
    {"augmentation": "gaussian", "regularizer": "consistency"},
    {"augmentation": "smoothadv", "smoothadv_warmup_epochs": 1},
]


def dpcert(**kwargs) -> DPCert:
    torch.manual_seed(0)
    return DPCert(
        **({"model": "cnn_tanh", "num_classes": 10, "input_shape": (1, 8, 8), "num_augmentations": 2} | kwargs)
    )


def batch(size: int = 6, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    return torch.rand(size, 1, 8, 8, generator=generator), torch.randint(0, 10, (size,), generator=generator)


def contributions(module: DPCert, x, y) -> list[torch.Tensor]:
    """Each example's clipped gradient: the clipped sum minus the clipped sum without that example."""
    clipper = PerExampleClipper(module, "per_example_loss", max_grad_norm=0.1)

    def clipped_sum(keep):
        torch.manual_seed(123)  # the same augmentation noise for the same (example, view) position
        views, labels = module.training_inputs((x, y))
        views, labels = views[keep], labels[keep]
        return torch.cat([g.flatten() for g in clipper((views, labels)).grads.values()])

    everyone = list(range(len(y)))
    total = clipped_sum(everyone)
    return [total - clipped_sum([j for j in everyone if j != i]) for i in everyone]


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: "-".join(map(str, v.values())))
def test_changing_one_example_leaves_the_others_clipped_gradients_unchanged(variant):
    module = dpcert(**variant)
    x, y = batch()
    before = contributions(module, x, y)
    x2, y2 = x.clone(), y.clone()
    x2[3], y2[3] = torch.rand_like(x2[3]), (y2[3] + 1) % 10
    after = contributions(module, x2, y2)
    for i in (0, 1, 2, 4, 5):
        torch.testing.assert_close(before[i], after[i], rtol=1e-4, atol=1e-6)
    assert not torch.allclose(before[3], after[3])
    assert all(c.norm() <= 0.1 * (1 + 1e-4) for c in before)


def test_views_are_the_clean_example_then_k_gaussian_copies():
    module = dpcert(sigma=0.5)
    x, y = batch(200)
    views, labels = module.training_inputs((x, y))
    assert views.shape == (200, 3, 1, 8, 8) and torch.equal(labels, y)
    torch.testing.assert_close(views[:, 0], x)
    noise = views[:, 1:] - x.unsqueeze(1)
    assert noise.std().item() == pytest.approx(0.5, rel=0.03)
    assert not torch.allclose(views[:, 1], views[:, 2])


def test_gaussian_loss_is_the_mean_cross_entropy_over_views():
    module = dpcert()
    views, y = module.training_inputs(batch())
    expected = torch.stack([F.cross_entropy(module(views[:, v]), y, reduction="none") for v in range(3)]).mean(0)
    torch.testing.assert_close(module.per_example_loss(views, y), expected)


def test_stability_adds_the_kl_between_clean_and_noisy_predictions_of_the_same_example():
    module = dpcert(regularizer="stability", regularization_weight=2.0)
    views, y = module.training_inputs(batch())
    plain = dpcert().per_example_loss(views, y)
    clean = module(views[:, 0]).softmax(-1)
    kl = torch.stack(
        [F.kl_div(module(views[:, v]).log_softmax(-1), clean, reduction="none").sum(-1) for v in (1, 2)]
    ).mean(0)
    torch.testing.assert_close(module.per_example_loss(views, y), plain + 2.0 * kl, rtol=1e-5, atol=1e-6)


def test_macer_hinge_applies_only_to_correct_examples_with_a_small_margin():
    module = dpcert(regularizer="macer", macer_gamma=0.1, regularization_weight=16.0, sigma=0.25)
    logits = torch.tensor([[[2.0, 0.0, 0.0]], [[2.0, 1.99, 0.0]], [[0.0, 2.0, 1.99]]]) / 16.0
    y = torch.tensor([0, 0, 0])
    hinge = module._macer(logits, y)
    assert hinge[0] == 0  # margin far above gamma
    assert hinge[2] == 0  # misclassified
    probs = logits[1, 0].mul(16).softmax(-1).sort(descending=True).values
    margin = torch.special.ndtri(probs[0]) - torch.special.ndtri(probs[1])
    assert hinge[1].item() == pytest.approx((16.0 * 0.25 / 2) * (0.1 - margin.item()), rel=1e-5)


def test_augmentation_multiplicity_costs_exactly_the_privacy_of_dp_sgd(tmp_path):
    def run(module):
        callback = DPCallback(max_grad_norm=1.0, noise_multiplier=1.0, delta=1e-5)
        quiet_trainer(tmp_path, max_epochs=2, callbacks=[callback]).fit(module, digits(batch_size=128))
        return callback

    cert, plain = run(dpcert(num_augmentations=4)), run(DPSGD(model="cnn_tanh", input_shape=(1, 8, 8)))
    assert cert.ledger.history == plain.ledger.history
    assert cert.loaders.sample_rate == plain.loaders.sample_rate == 128 / 1293
    assert cert.epsilon() == plain.epsilon()


@pytest.mark.parametrize(
    ("kwargs", "key"),
    [
        ({"augmentation": "mixup"}, "augmentation"),
        ({"regularizer": "trades"}, "regularizer"),
        ({"sigma": 0.0}, "sigma"),
        ({"num_augmentations": 0}, "num_augmentations"),
    ],
)
def test_bad_arguments_name_the_key(kwargs, key):
    with pytest.raises(ValueError, match=key):
        dpcert(**kwargs)
