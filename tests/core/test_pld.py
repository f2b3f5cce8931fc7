"""The PLD accountant against PRV, RDP and exact answers; gdp stays a labelled approximation that calibrates nothing."""

from __future__ import annotations

import math

import pytest

from lightning_dprobust.core.accounting import (
    DEFAULT_ACCOUNTANT,
    PLD_EPSILON_CAP,
    PLD_MAX_STEPS,
    ApproximateAccountingWarning,
    epsilon_for,
    gdp_mu_to_epsilon,
)
from lightning_dprobust.core.calibration import calibrate_noise_multiplier, max_steps_within_budget
from lightning_dprobust.core.pld import pld_epsilon

PRV_TOLERANCE = 0.03
"""|pld - prv| allowed: prv's own interval (eps_error 0.01, upper end reported) plus both discretizations."""
GRID = [(0.004, 0.8, 20), (0.004, 2.0, 500), (0.04, 0.8, 500), (0.04, 2.0, 20), (0.2, 0.8, 20), (0.2, 2.0, 500)]
"""(sample_rate, noise_multiplier, steps): epsilon from 0.03 to 12.6 at delta 1e-5."""


@pytest.mark.parametrize(("q", "sigma", "steps"), GRID)
def test_pld_is_below_rdp_and_agrees_with_prv(q, sigma, steps):
    history = [(sigma, q, steps)]
    pld, rdp = epsilon_for(history, 1e-5, "pld"), epsilon_for(history, 1e-5, "rdp")
    assert 0 < pld <= rdp
    assert pld == pytest.approx(epsilon_for(history, 1e-5, "prv"), abs=PRV_TOLERANCE)


def test_pld_reports_the_rdp_bound_beyond_its_cap():
    """Tiny noise: the PLD grid would need gigabytes; the (valid) RDP bound is reported instead."""
    history = [(0.8, 0.2, 500)]
    assert epsilon_for(history, 1e-5, "pld") == epsilon_for(history, 1e-5, "rdp") > PLD_EPSILON_CAP


def test_pld_composes_a_varying_schedule():
    history = [(1.0, 0.01, 300), (2.0, 0.04, 100), (0.8, 0.01, 50)]
    pld = epsilon_for(history, 1e-6, "pld")
    assert pld <= epsilon_for(history, 1e-6, "rdp")
    assert pld == pytest.approx(epsilon_for(history, 1e-6, "prv"), abs=PRV_TOLERANCE)
    assert pld > epsilon_for(history[:2], 1e-6, "pld") > epsilon_for(history[:1], 1e-6, "pld")


@pytest.mark.parametrize(("sigma", "steps", "delta"), [(10.0, 100, 1e-5), (5.0, 100, 1e-5), (4.530877117, 1, 1e-6)])
def test_pld_bounds_the_exact_full_batch_gaussian_from_above(sigma, steps, delta):
    """q = 1: T Gaussian steps are exactly (sqrt(T) / sigma)-GDP (Dong, Roth, Su 2019), whose epsilon is closed-form."""
    exact = gdp_mu_to_epsilon(math.sqrt(steps) / sigma, delta)
    assert exact <= epsilon_for([(sigma, 1.0, steps)], delta, "pld") <= exact + 0.01


def test_the_discretization_costs_less_than_a_hundredth():
    history = [(1.1, 0.02, 2000)]
    events = [_Event(*h) for h in history]
    coarse, fine = pld_epsilon(events, 1e-5), pld_epsilon(events, 1e-5, value_discretization_interval=1e-4)
    assert fine <= coarse + 1e-9
    assert coarse - fine < 0.01


def test_pld_is_the_default_accountant():
    assert DEFAULT_ACCOUNTANT == "pld"
    assert epsilon_for([(1.0, 0.01, 100)], 1e-5) == epsilon_for([(1.0, 0.01, 100)], 1e-5, "pld")


def test_gdp_under_reports_warns_and_cannot_calibrate():
    """q = 0.01, T = 100: the central-limit approximation reports less than half of the proven epsilon."""
    history = [(0.69, 0.01, 100)]
    with pytest.warns(ApproximateAccountingWarning, match="APPROXIMATION"):
        approximate = epsilon_for(history, 1e-5, "gdp")
    assert approximate < 0.5 * epsilon_for(history, 1e-5, "pld")
    with pytest.raises(ValueError, match="approximation.*target_epsilon.*pld.*prv.*rdp"):
        calibrate_noise_multiplier(1.0, 1e-5, 0.01, 100, accountant="gdp")
    with pytest.raises(ValueError, match="approximation.*epsilon_budget.*pld.*prv.*rdp"):
        max_steps_within_budget(1.0, 1e-5, 0.69, 0.01, accountant="gdp")


class _Event:
    def __init__(self, noise_multiplier: float, sample_rate: float, steps: int) -> None:
        self.noise_multiplier, self.sample_rate, self.steps = noise_multiplier, sample_rate, steps


def test_pld_reports_the_rdp_bound_beyond_a_million_steps_and_budgets_stay_fast():
    history = [(5.0, 0.001, PLD_MAX_STEPS + 1)]
    assert epsilon_for(history, 1e-5, "pld") == epsilon_for(history, 1e-5, "rdp")
    steps = max_steps_within_budget(10.0, 1e-5, 5.0, 0.001, accountant="pld")
    assert steps >= max_steps_within_budget(10.0, 1e-5, 5.0, 0.001, accountant="rdp") > PLD_MAX_STEPS
