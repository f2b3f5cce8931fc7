"""StoBatch math (spec section 17.1): sensitivities, dividers, budget identity, noise scales, batches, Taylor errors,
radius and the composition of two Laplace mechanisms (Lemma 5)."""

from __future__ import annotations

import math

import pytest
import torch

from lightning_dprobust.core import stobatch as sb

PAPER = {"mnist": (25, 196, 2499), "cifar10": (48, 196, 1851), "tiny_imagenet": (147, 1024, 4500)}


@pytest.mark.parametrize(
    ("dataset", "delta_r", "gamma_x"),
    [("mnist", 4950, 1.980792), ("cifar10", 9504, 5.134522), ("tiny_imagenet", 150822, 33.516)],
)
def test_sensitivities_and_gamma_x_match_the_paper(dataset, delta_r, gamma_x):
    d, beta, m = PAPER[dataset]
    assert sb.reconstruction_sensitivity(d, beta) == delta_r
    assert sb.gamma_x(delta_r, m) == pytest.approx(gamma_x, rel=1e-6)
    assert sb.label_sensitivity(256) == 512


@pytest.mark.parametrize("split", sb.BUDGET_SPLITS)
@pytest.mark.parametrize("epsilon", [2.0, 3.5, 10.0])
@pytest.mark.parametrize(("gamma", "gamma_x"), [(0.7, 1.98), (4.8, 33.5)])
def test_budget_split_gives_back_the_total(split, epsilon, gamma, gamma_x):
    eps1, eps2 = sb.split_budget(epsilon, split, gamma, gamma_x)
    assert sb.total_epsilon(eps1, eps2, gamma, gamma_x) == pytest.approx(epsilon, rel=1e-12)
    expected_eps2 = {"mnist": 0.1, "cifar10": 1 + (epsilon - 2) / 3, "tiny_imagenet": 1.0}[split]
    assert eps2 == pytest.approx(expected_eps2)


def test_budget_split_refuses_too_small_budgets_and_unknown_names():
    with pytest.raises(ValueError, match="too small"):
        sb.split_budget(0.1, "mnist", 1.0, 1.0)
    with pytest.raises(ValueError, match="too small"):
        sb.split_budget(1.5, "cifar10", 1.0, 1.0)
    with pytest.raises(ValueError, match="unknown"):
        sb.split_budget(2.0, "imagenet", 1.0, 1.0)


def test_label_noise_scale_of_the_paper():
    """MNIST at epsilon2 = 0.1: Delta_L2 / (m epsilon2) = 2.04882 per example."""
    assert sb.label_sensitivity(256) / (2499 * 0.1) == pytest.approx(2.04882, rel=1e-5)


@pytest.mark.parametrize("scale", [0.5, 3.0])
def test_laplace_has_the_requested_scale_and_follows_its_generator(scale):
    draws = sb.laplace((200_000,), scale, torch.Generator().manual_seed(0))
    assert draws.abs().mean().item() == pytest.approx(scale, rel=0.01)  # E|X| = b
    assert draws.var().item() == pytest.approx(2 * scale**2, rel=0.03)
    assert torch.isfinite(draws).all()
    again = sb.laplace((200_000,), scale, torch.Generator().manual_seed(0))
    assert torch.equal(draws, again)


def test_fixed_batches_are_disjoint_cover_and_are_reproducible_from_their_generator():
    batches = sb.fixed_disjoint_batches(1293, 120, torch.Generator().manual_seed(3))
    assert batches.shape == (10, 120)
    assert len(set(batches.flatten().tolist())) == 1200
    again = sb.fixed_disjoint_batches(1293, 120, torch.Generator().manual_seed(3))
    assert torch.equal(batches, again)
    with pytest.raises(ValueError, match="at least 2 disjoint batches"):
        sb.fixed_disjoint_batches(200, 120, torch.Generator())


def test_batch_membership_maps_each_example_to_its_one_batch_and_the_rest_to_minus_one():
    batches = sb.fixed_disjoint_batches(1293, 120, torch.Generator().manual_seed(3))
    membership = sb.batch_membership(batches, 1293)
    assert membership.shape == (1293,) and membership.dtype == torch.long
    for number, batch in enumerate(batches):
        assert (membership[batch] == number).all()
    assert (membership == -1).sum().item() == 93  # the rest of the partition belongs to no batch


def test_step_pairs_one_trainer_uses_every_batch_once_as_each_role():
    pairs = sb.step_pairs(10)
    assert sorted(b for b, _ in pairs) == list(range(10)) == sorted(a for _, a in pairs)
    assert all(b != a for b, a in pairs)


@pytest.mark.parametrize(("batches", "world"), [(10, 2), (9, 2), (13, 3)])
def test_step_pairs_give_each_batch_to_one_trainer_alone(batches, world):
    owned = [sb.step_pairs(batches, world, rank) for rank in range(world)]
    flat = [batch for pairs in owned for pair in pairs for batch in pair]
    assert len(flat) == len(set(flat))
    assert len({len(pairs) for pairs in owned}) == 1 and owned[0]


def test_first_order_taylor_error_of_the_reconstruction_is_quadratic():
    """The error over z^2 tends to F''(0) / 2 = 1/8 for every x: O(z^2), and no better."""
    x = torch.rand(1000, dtype=torch.float64) * 2 - 1
    for z in (1e-1, 1e-2, 1e-3):
        zt = torch.tensor(z, dtype=torch.float64)
        exact = x * torch.log1p(torch.exp(-zt)) + (1 - x) * torch.log1p(torch.exp(zt))
        approx = sb.LOG2 + (0.5 - x) * z
        ratio = (exact - approx) / z**2
        assert ratio.max().item() == pytest.approx(0.125, rel=0.05 if z > 0.05 else 0.01)


def test_second_order_taylor_cross_entropy_matches_tensorflow_up_to_a_cubic_error():
    z = torch.linspace(-0.1, 0.1, 201, dtype=torch.float64).view(-1, 1)
    for label in (0.0, 1.0):
        y = torch.full_like(z, label)
        exact = torch.nn.functional.binary_cross_entropy_with_logits(z, y, reduction="none")
        approx = torch.stack([sb.taylor_cross_entropy(zi, yi) for zi, yi in zip(z, y, strict=True)])
        assert ((exact.view(-1) - approx).abs() <= z.view(-1).abs() ** 3 / 50 + 1e-15).all()


def test_reconstruction_loss_forms():
    x_bar, x_tilde = torch.tensor([0.2, -1.0]), torch.tensor([1.0, 2.0])
    assert sb.reconstruction_loss(x_bar, x_tilde, "linear").item() == pytest.approx(0.3 * 1 + 1.5 * 2)
    assert sb.reconstruction_loss(x_bar, x_tilde, "absolute").item() == pytest.approx(2 * sb.LOG2 + 0.3 + 3.0)
    with pytest.raises(ValueError, match="reconstruction"):
        sb.reconstruction_loss(x_bar, x_tilde, "square")


def test_projection_bounds_the_input_norm_of_theta1():
    weight = torch.randn(16, 3, 4, 4)
    sb.project_theta1(weight, 1.5)
    assert sb.theta1_input_norm(weight).item() == pytest.approx(1.5, rel=1e-6)
    small = torch.full((2, 1, 2, 2), 0.01)
    sb.project_theta1(small, 1.5)
    assert torch.equal(small, torch.full((2, 1, 2, 2), 0.01))


def test_theta1_input_norm_bounds_the_l1_change_of_the_conv_output():
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(2, 5, 3, stride=1, padding=1, bias=False)
    x = torch.rand(1, 2, 6, 6)
    for c, i, j in [(0, 0, 0), (1, 3, 3), (0, 5, 2)]:
        bumped = x.clone()
        bumped[0, c, i, j] += 1
        change = (conv(bumped) - conv(x)).abs().sum().item()
        assert change <= sb.theta1_input_norm(conv.weight).item() + 1e-5


def test_radius_factor_is_the_harmonic_combination_of_kappa_and_phi():
    delta_r, m, eps1, drx, drh, eps_r = 4950, 2499, 0.7, 784.0, 30.0, 0.3
    b_x, b_h = delta_r / (m * eps1), 2 * delta_r / (m * eps1)
    kappa, phi = b_x / (drx / eps_r), b_h / (drh / eps_r)
    radius = eps_r * sb.radius_factor(delta_r, m, eps1, drx, drh)
    assert radius == pytest.approx(kappa * phi / (kappa + phi), rel=1e-12)
    assert radius <= min(kappa, phi)
    assert 2 * radius == pytest.approx(2 * eps_r * sb.radius_factor(delta_r, m, eps1, drx, drh))


def test_lemma5_composed_scores_respect_the_sum_of_the_two_epsilons():
    """Toy f with two independent Laplace mechanisms: E f(x) <= exp(s1/b1 + s2/b2) E f(x + alpha) (Monte Carlo)."""
    g = torch.Generator().manual_seed(0)
    b1, b2, alpha, n = 1.0, 2.0, 0.5, 400_000

    def composed(x: float) -> torch.Tensor:
        p_x = torch.sigmoid(3 * (x + sb.laplace((n,), b1, g).double()))
        p_h = torch.sigmoid(2 * (x + sb.laplace((n,), b2, g).double()))
        return (p_x * p_h).mean()

    bound = math.exp(alpha / b1 + alpha / b2)
    for x in (-1.0, 0.0, 1.0):
        ratio = (composed(x) / composed(x + alpha)).item()
        assert ratio <= bound * 1.01
        assert (composed(x + alpha) / composed(x)).item() <= bound * 1.01
