"""Residual perturbation's calculators (spec items 11-14) and the ledger's nominal events."""

from __future__ import annotations

import math

import numpy as np
import pytest

from lightning_dprobust.core.accounting import PrivacyLedger, epsilon_for
from lightning_dprobust.core.residual_privacy import (
    epsilon_at_lambda,
    grid_epsilon,
    theorem1_epsilon,
    theorem1_noise_floors,
    theorem2_epsilon,
    theorem2_noise_floors,
    theorem3_ratio,
)
from lightning_dprobust.core.sde_toy import permutation_velocity, recovery_error


@pytest.mark.parametrize(("gamma", "expected"), [(0.75, 3.24e5), (0.3, 2.01e6), (1.28, 1.12e5), (0.1, 1.80e7)])
def test_theorem1_matches_check_values(gamma, expected):
    assert theorem1_epsilon(gamma, epochs=100, delta=1e-5, bound_g=30) == pytest.approx(expected, rel=5e-3)


def test_theorem1_decreases_with_gamma_and_input_condition_binds_fourfold():
    values = [theorem1_epsilon(g, 100, 1e-5) for g in (0.1, 0.3, 0.75, 1.0, 2.0)]
    assert all(a > b for a, b in zip(values, values[1:], strict=False))
    gamma_only = 2 * 30**2 * 100 / 0.75**2
    both = theorem1_epsilon(0.75, 100, 1e-5, input_noise=0.375, bound_r=30)
    assert both == pytest.approx(4 * gamma_only + 2 * math.sqrt(4 * gamma_only * math.log(1e5)), rel=1e-9)
    assert both == pytest.approx(1.29e6, rel=5e-3)
    assert theorem1_epsilon(0.0, 100, 1e-5) == math.inf
    assert theorem1_epsilon(0.3, 0, 1e-5) == 0.0


@pytest.mark.parametrize("cost", [1.0, 37.0, 2.0e6])
def test_closed_form_equals_lambda_grid_minimum(cost):
    closed = theorem1_epsilon(math.sqrt(2 * 30**2 * 100 / cost), 100, 1e-5)
    assert closed == pytest.approx(grid_epsilon(cost, 1e-5), rel=1e-3)
    assert closed <= grid_epsilon(cost, 1e-5) * (1 + 1e-12)


def test_theorem1_floors_invert_the_epsilon():
    """At lam and epsilon, gamma exactly at the floor makes epsilon_at_lambda return that epsilon."""
    gamma_min, pi_min = theorem1_noise_floors(1e5, 1e-5, 0.6, epochs=100)
    assert gamma_min == pi_min
    assert epsilon_at_lambda(2 * 30**2 * 100 / gamma_min**2, 1e-5, 0.6) == pytest.approx(1e5, rel=1e-9)


def test_theorem2_floors_formula_and_monotone():
    eps, delta, lam, m, b, eta, a = 4.0, 1e-5, 0.5, 3, 2.0, 0.1, 1.5
    alpha = math.log(1 / delta) / ((1 - lam) * eps) + 1
    gamma_min, pi_min = theorem2_noise_floors(eps, delta, lam, m, b, eta, a)
    assert gamma_min == pytest.approx(b / eta * math.sqrt(2 * alpha * m / (lam * eps)))
    assert pi_min == pytest.approx(a * math.sqrt(2 * alpha * m / (lam * eps)))
    floors = [theorem2_noise_floors(e, delta, lam, m, b, eta, a) for e in (0.5, 1, 2, 8, 32)]
    assert all(x[0] > y[0] and x[1] > y[1] for x, y in zip(floors, floors[1:], strict=False))


def test_theorem2_epsilon_needs_floor_and_output_noise():
    assert theorem2_epsilon(2.0, 0.0, 0.1, 3, 1.0, 1.0, 1e-5) == math.inf
    assert theorem2_epsilon(2.0, 1.0, 0.0, 3, 1.0, 1.0, 1e-5) == math.inf
    eps = theorem2_epsilon(50.0, 20.0, 0.5, 3, 1.0, 1.0, 1e-5)
    gamma_min, pi_min = theorem2_noise_floors(eps * 1.01, 1e-5, 0.5, 3, 1.0, 0.5, 1.0)
    assert math.isfinite(eps) and gamma_min < 50.0 * 1.01 and pi_min < 20.0 * 1.01


def test_theorem3_ratio():
    assert theorem3_ratio(0.0, 0.5) == 1.0
    assert all(theorem3_ratio(g, p) < 1 for g in (0.1, 1.0) for p in (0.1, 0.5, 0.9))
    assert theorem3_ratio(1.0, 0.5, 2.0) == pytest.approx(math.exp(-0.25))
    with pytest.raises(ValueError, match="p=1"):
        theorem3_ratio(1.0, 1)


def test_sde_toy_ode_is_reversible_sde_is_not():
    image = np.random.default_rng(0).random((16, 16, 3))
    velocity = permutation_velocity(image.shape)
    assert recovery_error(image, velocity, gamma=0.0) < 0.05
    assert recovery_error(image, velocity, gamma=1.0, seed=0) > 0.5


def test_dpsgd_baseline_epsilon_matches_rdp_accountant():
    """Spec item 15: N = 9,988, b = 128, 100 epochs, sigma = 1.1 -> about 6.5 (not the paper's 15.79)."""
    steps = 100 * math.ceil(9988 / 128)
    eps = epsilon_for([(1.1, 128 / 9988, steps)], 1e-5)
    assert 5.5 < eps < 7.0


def test_ledger_nominal_claims_never_enter_epsilon_and_survive_state_dict():
    ledger = PrivacyLedger([(1.0, 0.01, 100)])
    assert math.isfinite(ledger.epsilon(1e-5)) and ledger.nominal_summary() is None
    ledger.record_nominal("theorem1", 1.0e5, 1e-5)
    ledger.record_nominal("theorem1", 2.0e5, 1e-5)
    assert ledger.epsilon(1e-5) == math.inf
    assert [(c.source, c.epsilon) for c in ledger.nominal] == [("theorem1", 2.0e5)]
    restored = PrivacyLedger()
    restored.load_state_dict(ledger.state_dict())
    assert restored.nominal == ledger.nominal and restored.epsilon(1e-5) == math.inf
    assert restored.history == ledger.history
    assert "nominal" not in PrivacyLedger([(1.0, 0.01, 1)]).state_dict()
    assert PrivacyLedger().epsilon(1e-5) == 0.0
    with pytest.raises(ValueError, match="source"):
        ledger.record_nominal("", 1.0, 1e-5)


def test_a_ledger_of_nominal_claims_only_reports_no_dp_guarantee_never_epsilon_zero():
    ledger = PrivacyLedger()
    ledger.record_nominal("residual_perturbation.theorem1", 3.24e5, 1e-5)
    assert ledger.history == () and ledger.epsilon(1e-5) == math.inf
    assert ledger.nominal_summary() == (
        "no DP guarantee; nominal epsilon 3.24e+05 at delta 1e-05 (residual_perturbation.theorem1)"
    )
