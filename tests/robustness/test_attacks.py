"""Attack suite, robust accuracy, mode preservation and SmoothAdv on a small digits model trained here."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
import torchattacks
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from lightning_dprobust.models import create_model
from lightning_dprobust.robustness.attacks import (
    ATTACKS,
    SmoothAdv,
    attack_guard,
    build_attack,
    format_table,
    preserve_modes,
    robust_accuracy,
    smoothed_cross_entropy,
)
from tests.helpers import trained_digits_classifier

LINF_EPS, L2_EPS = 0.1, 0.5
CHEAP_AUTOATTACK = dict(version="custom", attacks_to_run=["apgd-ce", "apgd-t"], steps=5)


@pytest.fixture(scope="module")
def trained():
    return trained_digits_classifier()


def accuracy(model, x, y) -> float:
    with torch.no_grad():
        return (model(x).argmax(1) == y).float().mean().item()


# ------------------------------------------------------------------------------------------------- the suite
@pytest.mark.parametrize("name", ["FGSM", "PGD", "PGDL2", "BIM", "MIFGSM", "MIM", "CW", "AutoAttack"])
def test_each_attack_stays_in_its_ball_and_in_the_unit_box(trained, name):
    model, x, y = trained
    x, y = x[:48], y[:48]
    eps = L2_EPS if name == "PGDL2" else LINF_EPS
    kwargs = CHEAP_AUTOATTACK if name == "AutoAttack" else {}
    attack = build_attack(name, model, eps, **kwargs)
    adversarial = attack(x, y)
    assert adversarial.shape == x.shape
    assert adversarial.min() >= 0.0 and adversarial.max() <= 1.0
    assert not torch.equal(adversarial, x)
    delta = (adversarial - x).flatten(1)
    if name == "PGDL2":
        assert delta.norm(dim=1).max() <= eps * (1 + 1e-5)
    elif name != "CW":  # CW minimizes the perturbation instead of bounding it
        assert delta.abs().max() <= eps + 1e-6


def test_step_size_defaults_and_aliases(trained):
    model = trained[0]
    assert build_attack("pgd", model, 0.1, steps=5).alpha == pytest.approx(2.5 * 0.1 / 5)
    assert build_attack("BIM", model, 0.1, steps=4).alpha == pytest.approx(0.1 / 4)
    assert isinstance(build_attack("MIM", model, 0.1), torchattacks.MIFGSM)
    assert build_attack("PGD", model, 0.1, alpha=0.3).alpha == 0.3
    assert isinstance(
        build_attack("AutoAttack", model, 0.1, attacks_to_run=["square"], version="custom"), torchattacks.Square
    )


def test_unknown_names_and_bad_budgets_are_refused(trained):
    model = trained[0]
    with pytest.raises(ValueError, match="choose one of") as error:
        build_attack("DeepFool9000", model, 0.1)
    for name in ATTACKS:
        assert name in str(error.value)
    with pytest.raises(ValueError, match="eps"):
        build_attack("PGD", model, -0.1)
    with pytest.raises(ValueError, match="steps"):
        build_attack("PGD", model, 0.1, steps=0)
    with pytest.raises(ValueError, match="subset"):
        build_attack("AutoAttack", model, 0.1, version="custom", attacks_to_run=["apgd-xx"])
    with pytest.raises(ValueError, match="needs eps"):
        robust_accuracy(model, trained[1:], ["PGD"])
    with pytest.raises(ValueError, match="reserved"):
        robust_accuracy(model, trained[1:], {"clean": build_attack("FGSM", model, 0.1)})


# ---------------------------------------------------------------------------------------------- robust accuracy
def test_pgd_lowers_accuracy_of_a_trained_model(trained):
    model, x, y = trained
    results = robust_accuracy(model, (x, y), ["PGD"], eps=LINF_EPS)
    assert results["clean"] == pytest.approx(accuracy(model, x, y))
    assert results["clean"] > 0.9
    assert results["PGD"] < results["clean"] - 0.2


def test_autoattack_never_exceeds_clean_and_zero_budget_changes_nothing(trained):
    model, x, y = trained
    auto = build_attack("AutoAttack", model, LINF_EPS, **CHEAP_AUTOATTACK)
    results = robust_accuracy(model, (x, y), {"AutoAttack": auto}, max_examples=96)
    assert results["AutoAttack"] <= results["clean"]
    unchanged = robust_accuracy(model, (x, y), ["PGD", "FGSM", "BIM"], eps=0.0)
    assert unchanged["PGD"] == unchanged["FGSM"] == unchanged["BIM"] == unchanged["clean"]


def test_max_examples_cuts_a_loader_mid_batch(trained):
    model, x, y = trained
    with torch.no_grad():
        predicted = model(x[:80]).argmax(1)
    labels = torch.cat([predicted[:50], (predicted[50:] + 1) % 10])  # first 50 right, last 30 wrong
    loader = DataLoader(TensorDataset(x[:80], labels), batch_size=32)
    assert robust_accuracy(model, loader, {}, max_examples=50)["clean"] == 1.0
    assert robust_accuracy(model, loader, {})["clean"] == pytest.approx(50 / 80)


def test_robust_accuracy_leaves_modes_grads_and_flags_as_they_were(trained):
    model, x, y = trained
    model.train()
    model.normalize.eval()
    grads = [torch.full_like(p, 0.5) for p in model.parameters()]
    for p, g in zip(model.parameters(), grads, strict=True):
        p.grad = g
    model.net.fc2.weight.requires_grad_(False)
    try:
        robust_accuracy(model, (x[:16], y[:16]), ["CW", "PGD"], eps=LINF_EPS)  # CW calls loss.backward()
        assert model.training and model.net.training and not model.normalize.training
        assert all(p.grad is g and bool((g == 0.5).all()) for p, g in zip(model.parameters(), grads, strict=True))
        assert [p.requires_grad for p in model.parameters()] == [
            p is not model.net.fc2.weight for p in model.parameters()
        ]
    finally:
        model.eval()
        model.net.fc2.weight.requires_grad_(True)
        model.zero_grad(set_to_none=True)


def test_format_table_is_markdown_with_percentages():
    table = format_table({"clean": 0.98, "PGD": 0.4125})
    assert table.splitlines() == ["| attack | accuracy (%) |", "|:--|--:|", "| clean | 98.00 |", "| PGD | 41.25 |"]


# ------------------------------------------------------------------------------------------ mode preservation
def mixed_mode_model() -> nn.Module:
    model = create_model("cnn_tanh", num_classes=10, input_shape=(1, 8, 8))
    model.train()
    model.normalize.eval()
    model.net.pool1.eval()
    return model


def test_preserve_modes_restores_mixed_modes_that_torchattacks_flips():
    model = mixed_mode_model()
    expected = {name: m.training for name, m in model.named_modules()}
    x, y = torch.rand(4, 1, 8, 8), torch.arange(4)
    torchattacks.PGD(model, eps=0.1, steps=2)(x, y)
    assert model.normalize.training  # torchattacks' model.train() flipped the frozen submodule
    model = mixed_mode_model()
    with preserve_modes(model):
        torchattacks.PGD(model, eps=0.1, steps=2)(x, y)
    assert {name: m.training for name, m in model.named_modules()} == expected
    with pytest.raises(RuntimeError, match="boom"), preserve_modes(model):
        model.eval()
        raise RuntimeError("boom")
    assert {name: m.training for name, m in model.named_modules()} == expected


def test_attack_guard_removes_new_grad_samples_and_restores_old_ones():
    model = create_model("cnn_tanh", num_classes=10, input_shape=(1, 8, 8))
    first, *others = list(model.parameters())
    first.grad_sample = "kept"
    with attack_guard(model):
        assert torch.is_grad_enabled() and not any(p.requires_grad for p in model.parameters())
        for p in model.parameters():
            p.grad_sample = torch.zeros(1)
    assert first.grad_sample == "kept"
    assert not any(hasattr(p, "grad_sample") for p in others)
    assert all(p.requires_grad and p.grad is None for p in model.parameters())


# ------------------------------------------------------------------------------------------------- SmoothAdv
def test_smoothadv_increases_the_smoothed_loss_under_the_same_noise(trained):
    model, x, y = trained
    x, y = x[:64], y[:64]
    attack = SmoothAdv(model, eps=0.5, sigma=0.25, steps=4, num_noise=4, seed=1)
    adversarial = attack(x, y)
    noise = attack.last_noise
    assert noise.shape == (64, 4, 1, 8, 8)
    assert noise.std().item() == pytest.approx(0.25, rel=0.05)
    with torch.no_grad():
        before = smoothed_cross_entropy(model, x, y, noise)
        after = smoothed_cross_entropy(model, adversarial, y, noise)
    assert (after > before).float().mean() > 0.9
    assert after.mean() > before.mean() + 0.3


def test_smoothed_cross_entropy_matches_the_definition():
    model = nn.Sequential(nn.Flatten(), nn.Linear(4, 3))
    x, y, noise = torch.rand(2, 1, 2, 2), torch.tensor([0, 2]), torch.randn(2, 5, 1, 2, 2)
    for i in range(2):
        mean_p = torch.stack([F.softmax(model(x[i : i + 1] + noise[i, j]), dim=1)[0] for j in range(5)]).mean(0)
        expected = -torch.log(mean_p[y[i]])
        torch.testing.assert_close(smoothed_cross_entropy(model, x, y, noise)[i], expected)


def test_smoothadv_one_step_on_a_linear_model_moves_along_the_closed_form_direction():
    # Two-class linear model, no noise: the loss gradient for label 0 points along w1 - w0, so one normalized step
    # of size eps lands at x + eps (w1 - w0) / ||w1 - w0||.
    linear = nn.Linear(6, 2)
    model = nn.Sequential(nn.Flatten(), linear)
    x, y = torch.full((1, 1, 2, 3), 0.5), torch.tensor([0])
    adversarial = SmoothAdv(model, eps=0.05, sigma=0.0, steps=1, alpha=0.05)(x, y)
    direction = (linear.weight[1] - linear.weight[0]).detach()
    torch.testing.assert_close((adversarial - x).flatten(), 0.05 * direction / direction.norm())


def test_smoothadv_stays_in_the_ball_and_box_and_treats_examples_separately(trained):
    model, x, y = trained
    x, y = x[:32], y[:32]
    for eps in (0.3, 3.0):
        adversarial = SmoothAdv(model, eps=eps, sigma=0.5, steps=5, num_noise=2, alpha=eps)(x, y)
        assert (adversarial - x).flatten(1).norm(dim=1).max() <= eps * (1 + 1e-5)
        assert adversarial.min() >= 0 and adversarial.max() <= 1
    changed = x.clone()
    changed[5] = 1 - changed[5]
    first = SmoothAdv(model, eps=0.5, steps=3, num_noise=3, seed=7)(x, y)
    second = SmoothAdv(model, eps=0.5, steps=3, num_noise=3, seed=7)(changed, y)
    keep = torch.arange(32) != 5
    torch.testing.assert_close(first[keep], second[keep])
    assert not torch.allclose(first[5], second[5])


def test_smoothadv_takes_a_random_direction_where_the_gradient_vanishes():
    constant = nn.Sequential(nn.Flatten(), nn.Linear(4, 3))
    nn.init.zeros_(constant[1].weight)
    x = torch.full((3, 1, 2, 2), 0.5)
    adversarial = SmoothAdv(constant, eps=0.1, sigma=0.1, steps=1, alpha=0.1)(x, torch.zeros(3, dtype=torch.long))
    torch.testing.assert_close((adversarial - x).flatten(1).norm(dim=1), torch.full((3,), 0.1))


def test_smoothadv_fresh_noise_option_and_argument_checks(trained):
    model, x, y = trained
    fixed = SmoothAdv(model, steps=3, num_noise=2, seed=3)
    fresh = SmoothAdv(model, steps=3, num_noise=2, seed=3, fixed_noise=False)
    fixed(x[:4], y[:4])
    fresh(x[:4], y[:4])
    assert not torch.equal(fixed.last_noise, fresh.last_noise)  # fresh: the last step's draws, not the first's
    with pytest.raises(ValueError, match="steps >= 1"):
        SmoothAdv(model, steps=0)
    assert math.isclose(SmoothAdv(model, eps=0.5, steps=4).alpha, 0.25)


@pytest.mark.slow
def test_standard_autoattack_is_bounded_and_never_exceeds_clean(trained):
    model, x, y = trained
    auto = build_attack("AutoAttack", model, LINF_EPS, version="standard", n_classes=10)
    adversarial = auto(x[:32], y[:32])
    assert (adversarial - x[:32]).abs().max() <= LINF_EPS + 1e-6
    assert adversarial.min() >= 0 and adversarial.max() <= 1
    assert accuracy(model, adversarial, y[:32]) <= accuracy(model, x[:32], y[:32])


def test_the_package_loads_torchattacks_only_on_first_use():
    code = (
        "import sys, lightning_dprobust.robustness as e; assert 'torchattacks' not in sys.modules; "
        "e.build_attack; assert 'torchattacks' in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
