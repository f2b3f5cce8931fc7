"""The PixelDP bounds, robustness size and radius (Lecuyer et al. 2019; Phan et al. 2020) against closed forms.

References: Hoeffding's width ``sqrt(ln(1/a) / 2n)`` by formula; Clopper-Pearson against scipy's exact binomial
confidence interval (``binomtest(...).proportion_ci(method="exact")``, a two-sided interval at ``1 - 2a`` whose ends
are the one-sided bounds at ``a``) and the closed forms at ``count = 0`` and ``count = n``.
"""

from __future__ import annotations

import math

import pytest
import torch
from scipy.stats import binomtest

from lightning_dprobust.core.pixeldp import (
    bonferroni_hypotheses,
    certified_radius,
    clopper_pearson_upper,
    group_sizes,
    hoeffding_width,
    passes_robustness_check,
    radius_scale,
    robustness_size,
    top_two_bounds,
)
from lightning_dprobust.core.smoothing import lower_confidence_bound

K = 10


def exact_interval(count: int, n: int, alpha: float) -> tuple[float, float]:
    ci = binomtest(count, n).proportion_ci(confidence_level=1 - 2 * alpha, method="exact")
    return ci.low, ci.high


@pytest.mark.parametrize("n, alpha", [(10, 0.05), (1000, 0.005), (2000, 0.0025)])
def test_hoeffding_width_is_the_formula_and_its_tail_bound_is_alpha(n, alpha):
    width = hoeffding_width(n, alpha)
    assert width == pytest.approx(math.sqrt(math.log(1 / alpha) / (2 * n)), rel=1e-12)
    assert math.exp(-2 * n * width**2) == pytest.approx(alpha, rel=1e-9)


@pytest.mark.parametrize("count, n, alpha", [(0, 50, 0.01), (7, 50, 0.01), (50, 50, 0.01), (613, 1000, 0.005)])
def test_clopper_pearson_bounds_match_scipys_exact_interval(count, n, alpha):
    low, high = exact_interval(count, n, alpha)
    assert lower_confidence_bound(count, n, alpha) == pytest.approx(low, abs=1e-10)
    assert clopper_pearson_upper(count, n, alpha) == pytest.approx(high, abs=1e-10)


def test_clopper_pearson_upper_closed_forms():
    assert clopper_pearson_upper(0, 40, 0.05) == pytest.approx(1 - 0.05 ** (1 / 40), rel=1e-10)
    assert clopper_pearson_upper(40, 40, 0.05) == 1.0


@pytest.mark.parametrize("condition, hypotheses", [("paper", K), ("strict", 2 * K)])
def test_bonferroni_splits_eta_over_k_or_2k_one_sided_bounds(condition, hypotheses):
    assert bonferroni_hypotheses(K, condition) == hypotheses
    n, eta = 500, 0.05
    counts = torch.tensor([[300, 150] + [6] * 7 + [8]])
    assert counts.sum() == n
    _, lower, upper = top_two_bounds(counts, n, eta, "clopper_pearson", condition)
    assert lower.item() == pytest.approx(exact_interval(300, n, eta / hypotheses)[0], abs=1e-10)
    assert upper.item() == pytest.approx(exact_interval(150, n, eta / hypotheses)[1], abs=1e-10)
    means = torch.tensor([[0.5, 0.3] + [0.02] * 8], dtype=torch.float64)
    _, lower, upper = top_two_bounds(means, n, eta, "hoeffding", condition)
    width = math.sqrt(math.log(hypotheses / eta) / (2 * n))
    assert lower.item() == pytest.approx(0.5 - width, rel=1e-12)
    assert upper.item() == pytest.approx(0.3 + width, rel=1e-12)


@pytest.mark.parametrize("bound", ["clopper_pearson", "hoeffding"])
def test_more_draws_give_tighter_bounds(bound):
    widths = []
    for n in (100, 1000, 10000):
        if bound == "hoeffding":
            estimate = torch.tensor([[0.6, 0.3, 0.1]], dtype=torch.float64)
        else:
            estimate = torch.tensor([[6 * n // 10, 3 * n // 10, n // 10]])
        _, lower, upper = top_two_bounds(estimate, n, 0.05, bound, "paper")
        widths.append((upper - lower).item())
    assert widths[0] > widths[1] > widths[2]


def test_predictions_are_the_argmax_and_the_runner_up_bounds_the_others():
    counts = torch.tensor([[10, 70, 20], [40, 40, 20]])
    prediction, lower, upper = top_two_bounds(counts, 100, 0.05, "clopper_pearson", "paper")
    assert prediction.tolist() == [1, 0]
    alpha = 0.05 / 3
    assert upper[0].item() == pytest.approx(clopper_pearson_upper(20, 100, alpha))
    assert lower[1].item() < upper[1].item()  # a tie is never certified
    assert robustness_size(lower, upper)[1].item() == 0.0


def test_robustness_size_meets_eq_12_with_equality_and_is_zero_without_a_margin():
    lower = torch.tensor([0.9, 0.5, 0.3, 0.0], dtype=torch.float64)
    upper = torch.tensor([0.05, 0.4, 0.3, 0.2], dtype=torch.float64)
    eps = robustness_size(lower, upper)
    assert eps[:2].tolist() == pytest.approx([0.5 * math.log(0.9 / 0.05), 0.5 * math.log(0.5 / 0.4)], rel=1e-12)
    assert eps[2:].tolist() == [0.0, 0.0]
    assert torch.allclose(lower[:2], torch.exp(2 * eps[:2]) * upper[:2], rtol=1e-12)
    assert passes_robustness_check(lower[:2], upper[:2], eps[:2] - 1e-9).all()
    assert not passes_robustness_check(lower[:2], upper[:2], eps[:2] + 1e-9).any()


def test_radius_is_kappa_phi_over_kappa_plus_phi_linear_in_epsilon_and_at_most_min():
    # MNIST-sized constants (spec 17.1.1): d = 25, beta = 196, m = 2499
    delta_r_big, m, eps1, delta_rx, delta_rh = 25 * 198, 2499, 0.5, 25 * 0.1, 3.7
    scale = radius_scale(delta_r_big, m, eps1, delta_rx, delta_rh)
    assert scale == pytest.approx(delta_r_big / (m * eps1 * (delta_rx + delta_rh / 2)), rel=1e-12)
    for eps_r in (0.1, 0.7, 2.0):
        kappa, phi = group_sizes(eps_r, delta_r_big, m, eps1, delta_rx, delta_rh)
        radius = certified_radius(torch.tensor(eps_r, dtype=torch.float64), scale, "paper").item()
        assert radius == pytest.approx(kappa * phi / (kappa + phi), rel=1e-12)
        assert radius <= min(kappa, phi)
        assert radius == pytest.approx(eps_r * scale, rel=1e-12)


def test_strict_radius_is_the_paper_radius_over_psi():
    eps = torch.tensor([0.0, 0.3, 1.2], dtype=torch.float64)
    paper = certified_radius(eps, 0.8, "paper", psi=2.0)
    strict = certified_radius(eps, 0.8, "strict", psi=2.0)
    assert torch.allclose(paper, eps * 0.8) and torch.allclose(strict, paper / 2.0)


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: top_two_bounds(torch.tensor([[3, 1]]), 0, 0.05, "clopper_pearson", "paper"), "n must be"),
        (lambda: top_two_bounds(torch.tensor([[3, 1]]), 4, 0.0, "clopper_pearson", "paper"), "eta must lie"),
        (lambda: top_two_bounds(torch.tensor([[3, 1]]), 4, 1.0, "clopper_pearson", "paper"), "eta must lie"),
        (lambda: top_two_bounds(torch.tensor([[3, 1]]), 4, 0.05, "wald", "paper"), "bound must be"),
        (lambda: top_two_bounds(torch.tensor([[3, 1]]), 4, 0.05, "clopper_pearson", "loose"), "condition must be"),
        (lambda: top_two_bounds(torch.tensor([3, 1]), 4, 0.05, "clopper_pearson", "paper"), r"\[B, K\]"),
        (lambda: top_two_bounds(torch.tensor([[4]]), 4, 0.05, "clopper_pearson", "paper"), r"\[B, K\]"),
        (lambda: top_two_bounds(torch.tensor([[4, 1]]), 4, 0.05, "clopper_pearson", "paper"), "summing"),
        (lambda: top_two_bounds(torch.tensor([[0.5, 0.2]]), 4, 0.05, "clopper_pearson", "paper"), "integer"),
        (lambda: top_two_bounds(torch.tensor([[1.5, 0.2]]), 4, 0.05, "hoeffding", "paper"), r"\[0, 1\]"),
        (lambda: certified_radius(torch.tensor([0.1]), 1.0, "strict", psi=0.5), "psi must be"),
        (lambda: certified_radius(torch.tensor([0.1]), -1.0, "paper"), "radius scale must be"),
        (lambda: radius_scale(4950, 0, 0.5, 2.5, 1.0), "m must be"),
    ],
)
def test_bad_inputs_are_refused_with_one_clear_line(call, message):
    with pytest.raises(ValueError, match=message):
        call()
