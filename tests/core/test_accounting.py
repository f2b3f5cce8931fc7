"""Accountant tests against Opacus' and dp_accounting's unit vectors, closed forms, quadrature and the literature."""

from __future__ import annotations

import itertools
import logging
import math
import pickle

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import integrate, stats

from lightning_dprobust.core.accounting import (
    ACCOUNTANTS,
    DEFAULT_RDP_ORDERS,
    PrivacyEvent,
    PrivacyLedger,
    compute_rdp,
    default_delta,
    epsilon_for,
    gdp_epsilon,
    gdp_mu_to_epsilon,
    rdp_to_epsilon,
)
from lightning_dprobust.core.calibration import BUDGET_REL_TOL, calibrate_noise_multiplier, max_steps_within_budget

# Opacus tests/accountants_test.py: sigma=1.5, q=0.04; RDP uses int(90 / 0.04), PRV and GDP use int(90 // 0.04).
OPACUS_SIGMA, OPACUS_Q = 1.5, 0.04


# ------------------------------------------------------------------------------------------ reference vectors


def test_rdp_matches_opacus_unit_vector():
    assert epsilon_for([(OPACUS_SIGMA, OPACUS_Q, int(90 / 0.04))], 1e-5, "rdp") == pytest.approx(
        7.32911117143, abs=1e-6
    )


def test_prv_matches_opacus_unit_vector():
    epsilon = epsilon_for([(OPACUS_SIGMA, OPACUS_Q, int(90 // 0.04))], 1e-5, accountant="prv")
    assert epsilon == pytest.approx(6.777395712150674, abs=1e-3)


def test_gdp_matches_opacus_unit_vector():
    assert 6.59 < gdp_epsilon([(OPACUS_SIGMA, OPACUS_Q, int(90 // 0.04))], 1e-5) < 6.6


def test_calibration_matches_opacus_get_noise_multiplier():
    steps = int(90 / 0.04)
    sigma = calibrate_noise_multiplier(8.0, 1e-5, OPACUS_Q, steps, accountant="rdp")
    assert sigma == pytest.approx(1.416, rel=0.01)
    assert 8.0 * (1 - 0.005) <= epsilon_for([(sigma, OPACUS_Q, steps)], 1e-5, "rdp") <= 8.0


# Modern RDP column of the cross-library table (Opacus RDP, Balle et al. conversion), 4 decimals.
MODERN_RDP_TABLE = [
    (4.0, 0.01, 10000, 1e-5, 1.0355),  # Abadi et al. 2016 example
    (1.3, 150 / 60000, 6000, 1e-5, 0.7242),  # TF-privacy test 0
    (1.0, 100 / 100000, 30000, 1e-7, 1.4155),  # TF-privacy test 1
    (1.1, 256 / 60000, 14063, 1e-5, 2.5967),  # TF MNIST tutorial
    (1.3, 0.004, 3750, 1e-5, 0.9220),  # Opacus MNIST README
    (0.7, 0.004, 11250, 1e-5, 6.0925),
    (1.54, 0.02048, 1464, 1e-5, 2.6083),
    (0.8, 0.005, 1000, 1e-6, 2.6265),  # prv_accountant README
]


@pytest.mark.parametrize(("sigma", "q", "steps", "delta", "expected"), MODERN_RDP_TABLE)
def test_rdp_matches_cross_library_table(sigma, q, steps, delta, expected):
    assert epsilon_for([(sigma, q, steps)], delta, "rdp") == pytest.approx(expected, abs=1e-4)


@pytest.mark.parametrize(
    ("sigma", "q", "steps", "delta", "expected", "order"),
    [(1.3, 150 / 60000, 6000, 1e-5, 0.7242234026109595, 19.0), (1.0, 1e-3, 30000, 1e-7, 1.4154988495444842, 13.0)],
)
def test_rdp_matches_tf_privacy_regression_values(sigma, q, steps, delta, expected, order):
    epsilon, best_order = rdp_to_epsilon(DEFAULT_RDP_ORDERS, compute_rdp(q, sigma, steps), delta)
    assert epsilon == pytest.approx(expected, rel=1e-9)
    assert best_order == order


@pytest.mark.parametrize(
    ("sigma", "q", "steps", "expected"),
    [(4.0, 0.01, 10000, 1.2586), (1.1, 256 / 60000, 14063, 3.0084), (1.3, 0.004, 3750, 1.1597)],
)
def test_old_conversion_reproduces_published_values(sigma, q, steps, expected):
    """Abadi et al. 2016 (eps ~ 1.26), TF tutorial (3.01), Opacus README (1.16) used eps = min rdp - log(d)/(a-1)."""
    orders = np.asarray(DEFAULT_RDP_ORDERS)
    old_epsilon = np.min(compute_rdp(q, sigma, steps) - math.log(1e-5) / (orders - 1))
    assert old_epsilon == pytest.approx(expected, abs=1e-4)


def test_rdp_matches_dp_accounting_unit_vector():
    """dp_accounting's rdp_privacy_accountant_test vector (q=0.01, sigma=2.5, count=50), rtol 1e-4.

    At order 1.5 that vector holds 6.70579741e-4, the sum of the absolute values of the alternating series (an
    upper bound); the exact value, by 40-digit mpmath quadrature of the RDP integral, is 6.50070897188e-4.
    """
    rdp = compute_rdp(0.01, 2.5, 50, orders=[1.5, 2.5, 5, 50, 100])
    expected = [6.50070897188e-4, 1.08548710e-3, 2.18075656e-3, 2.38460375e-2, 1.67416308e2]
    np.testing.assert_allclose(rdp, expected, rtol=1e-4)
    assert rdp[0] < 6.70579741e-4


@pytest.mark.parametrize(("q", "sigma"), [(0.04, 1.5), (0.5, 0.6), (0.001, 5.0), (0.1, 1.0), (0.3, 3.0), (0.01, 2.5)])
@pytest.mark.parametrize("alpha", [1.1, 2.5, 4.7, 10.9])
def test_rdp_matches_numerical_integration(q, sigma, alpha):
    """RDP definition: log E_{z~N(0,s^2)}[(1 - q + q exp((2z - 1) / 2s^2))^a] / (a - 1), by adaptive quadrature."""
    z0 = sigma**2 * math.log(1 / q - 1) + 0.5

    def integrand(z: float) -> float:
        log_ratio = np.logaddexp(math.log1p(-q), math.log(q) + (2 * z - 1) / (2 * sigma**2))
        return math.exp(stats.norm.logpdf(z, scale=sigma) + alpha * log_ratio)

    pieces = [(-math.inf, 0.0), (0.0, z0), (z0, z0 + 40 * sigma), (z0 + 40 * sigma, math.inf)]
    a_alpha = sum(integrate.quad(integrand, lo, hi, epsabs=0, epsrel=1e-12, limit=200)[0] for lo, hi in pieces)
    assert compute_rdp(q, sigma, 1, orders=[alpha])[0] == pytest.approx(math.log(a_alpha) / (alpha - 1), rel=1e-6)


# ------------------------------------------------------------------------------------- dp_accounting and Opacus

GRID_Q = (0.001, 0.01, 0.1, 0.5, 1.0)
GRID_SIGMA = (0.6, 1.0, 2.0, 5.0)
GRID_STEPS = (1, 100, 5000)
GRID_DELTA = (1e-5, 1e-7)


@pytest.fixture(scope="module")
def dp_accounting_rdp() -> dict[tuple[float, float], np.ndarray]:
    """dp_accounting's RDP of one PoissonSampledDpEvent(GaussianDpEvent) per (q, sigma), on our orders."""
    dp_accounting = pytest.importorskip("dp_accounting")
    table = {}
    logging.disable(logging.WARNING)  # dp_accounting logs every order whose series it stops after 1000 terms
    try:
        for q, sigma in itertools.product(GRID_Q, GRID_SIGMA):
            accountant = dp_accounting.rdp.RdpAccountant(orders=list(DEFAULT_RDP_ORDERS))
            accountant.compose(dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma)))
            table[q, sigma] = np.asarray(accountant._rdp)
    finally:
        logging.disable(logging.NOTSET)
    return table


def test_dp_accounting_composes_steps_by_scaling(dp_accounting_rdp):
    """Justifies comparing ``steps * (one-step RDP)`` below with dp_accounting composing the event ``steps`` times."""
    import dp_accounting

    accountant = dp_accounting.rdp.RdpAccountant(orders=list(DEFAULT_RDP_ORDERS))
    accountant.compose(dp_accounting.PoissonSampledDpEvent(0.01, dp_accounting.GaussianDpEvent(1.0)), 5000)
    np.testing.assert_allclose(accountant._rdp, 5000 * dp_accounting_rdp[0.01, 1.0], rtol=1e-12)
    assert accountant.get_epsilon(1e-5) == pytest.approx(epsilon_for([(1.0, 0.01, 5000)], 1e-5, "rdp"), rel=1e-3)


@pytest.mark.parametrize(("q", "sigma"), list(itertools.product(GRID_Q, GRID_SIGMA)))
def test_rdp_agrees_with_dp_accounting(dp_accounting_rdp, q, sigma):
    """Integer orders use the exact finite sum in both libraries: equal. At fractional orders dp_accounting 0.6
    adds the absolute values of the alternating series (and drops orders after 1000 terms), an upper bound, so
    ours (exact, checked by quadrature above) is never larger; epsilons then agree where that slack is small."""
    from dp_accounting.rdp.rdp_privacy_accountant import compute_epsilon

    orders = np.asarray(DEFAULT_RDP_ORDERS)
    integer = orders == np.round(orders)
    ours, theirs = compute_rdp(q, sigma, 1), dp_accounting_rdp[q, sigma]
    np.testing.assert_allclose(ours[integer], theirs[integer], rtol=1e-9)
    assert np.all(ours <= theirs * (1 + 1e-9))
    assert epsilon_for([(sigma, q, 100)], 1e-5, "rdp") == pytest.approx(
        rdp_to_epsilon(orders, 100 * ours, 1e-5)[0], rel=1e-12
    )
    for steps, delta in itertools.product(GRID_STEPS, GRID_DELTA):
        ours_eps, ours_order = rdp_to_epsilon(orders, steps * ours, delta)
        assert (ours_eps, ours_order) == pytest.approx(compute_epsilon(orders, steps * ours, delta), rel=1e-12)
        theirs_eps = compute_epsilon(orders, steps * theirs, delta)[0]
        assert ours_eps <= theirs_eps * (1 + 1e-9)
        if q <= 0.01 and sigma >= 1.0 or q == 1.0:
            assert ours_eps == pytest.approx(theirs_eps, rel=1e-3)


@pytest.mark.parametrize(("q", "sigma"), [(0.5, 0.6), (0.1, 1.0), (0.001, 0.6), (0.01, 5.0)])
def test_rdp_agrees_with_opacus_signed_series(q, sigma):
    from opacus.accountants.analysis.rdp import compute_rdp as opacus_compute_rdp

    theirs = opacus_compute_rdp(q=q, noise_multiplier=sigma, steps=100, orders=list(DEFAULT_RDP_ORDERS))
    np.testing.assert_allclose(compute_rdp(q, sigma, 100), theirs, rtol=1e-4)


# ---------------------------------------------------------------------------------------- q = 1: exact answers


def test_full_batch_gaussian_composition_is_exact_gdp():
    """T Gaussian mechanisms with noise sigma are (sqrt(T) / sigma)-GDP; prv_accountant's ground truth values."""
    assert gdp_mu_to_epsilon(math.sqrt(100) / 10.0, 1e-5) == pytest.approx(4.3772, abs=1e-4)
    assert gdp_mu_to_epsilon(math.sqrt(100) / 5.0, 1e-5) == pytest.approx(9.9973, abs=1e-4)
    assert gdp_mu_to_epsilon(1 / 4.530877117, 1e-6) == pytest.approx(0.9274, abs=1e-4)
    history = [(10.0, 1.0, 100)]
    assert epsilon_for(history, 1e-5, accountant="prv") == pytest.approx(4.3772, abs=0.02)
    assert epsilon_for(history, 1e-5, accountant="pld") == pytest.approx(4.3772, abs=0.01)
    assert epsilon_for(history, 1e-5, accountant="pld") >= 4.3772
    assert epsilon_for(history, 1e-5, accountant="rdp") >= 4.3772
    np.testing.assert_allclose(compute_rdp(1.0, 10.0, 100, orders=[2, 7.5]), [100 * 2 / 200, 100 * 7.5 / 200])


def test_rdp_gaussian_reaches_dp_accounting_epsilon_one():
    assert epsilon_for([(4.530877117, 1.0, 1)], 1e-6, "rdp") == pytest.approx(1.0, abs=1e-5)


def test_gdp_rejects_a_varying_schedule():
    with pytest.raises(ValueError, match="constant"):
        gdp_epsilon([(1.0, 0.01, 10), (2.0, 0.01, 10)], 1e-5)


# ------------------------------------------------------------------------------------------------------ ledger


def test_ledger_merges_consecutive_equal_events():
    ledger = PrivacyLedger([(1.0, 0.01, 3), PrivacyEvent(1.0, 0.01, 2)])
    ledger.record(1.0, 0.01)
    ledger.record(2.0, 0.01, steps=0)
    ledger.record(2.0, 0.01, steps=4)
    ledger.record(1.0, 0.01)
    assert ledger.history == (PrivacyEvent(1.0, 0.01, 6), PrivacyEvent(2.0, 0.01, 4), PrivacyEvent(1.0, 0.01, 1))
    assert ledger.steps == 11
    merged = ledger.epsilon(1e-5)
    assert merged == pytest.approx(epsilon_for([(1.0, 0.01, 7), (2.0, 0.01, 4)], 1e-5), rel=1e-9)


def test_ledger_state_dict_round_trip():
    ledger = PrivacyLedger([(1.1, 0.004, 100), (0.9, 0.004, 7)])
    state = ledger.state_dict()
    assert pickle.loads(pickle.dumps(state)) == state
    assert all(type(v) in (float, int) for event in state["history"] for v in event)
    restored = PrivacyLedger()
    restored.load_state_dict(state)
    assert restored.history == ledger.history
    assert restored.epsilon(1e-5) == ledger.epsilon(1e-5)


def test_ledger_state_dict_loads_with_torch_weights_only(tmp_path):
    torch = pytest.importorskip("torch")
    ledger = PrivacyLedger([(1.1, 0.004, 100)])
    torch.save({"ledger": ledger.state_dict()}, tmp_path / "ledger.pt")
    restored = PrivacyLedger()
    restored.load_state_dict(torch.load(tmp_path / "ledger.pt", weights_only=True)["ledger"])
    assert restored.history == ledger.history


@pytest.mark.parametrize(
    ("args", "match"),
    [
        ((0.0, 0.1, 1), "noise_multiplier"),
        ((math.inf, 0.1, 1), "noise_multiplier"),
        ((math.nan, 0.1, 1), "noise_multiplier"),
        ((1.0, 0.0, 1), "sample_rate"),
        ((1.0, 1.5, 1), "sample_rate"),
        ((1.0, 0.1, -1), "steps"),
        ((1.0, 0.1, 1.5), "steps"),
        ((1.0, 0.1, True), "steps"),
    ],
)
def test_ledger_record_rejects_invalid_events(args, match):
    ledger = PrivacyLedger()
    with pytest.raises(ValueError, match=match):
        ledger.record(*args)
    assert ledger.history == ()


def test_ledger_rejects_bad_state_and_keeps_its_history():
    ledger = PrivacyLedger([(1.0, 0.1, 2)])
    for state in ({"events": []}, {"history": [(1.0, 2.0, 1)]}, {"history": [(1.0, 0.1)]}):
        with pytest.raises(ValueError):
            ledger.load_state_dict(state)
    assert ledger.history == (PrivacyEvent(1.0, 0.1, 2),)


@pytest.mark.parametrize("accountant", ACCOUNTANTS)
def test_empty_ledger_spends_nothing(accountant):
    assert PrivacyLedger().epsilon(1e-5, accountant) == 0.0
    assert PrivacyLedger([(1.0, 0.1, 0)]).epsilon(1e-5, accountant) == 0.0


def test_unknown_accountant_and_bad_delta_are_rejected():
    with pytest.raises(ValueError, match="rdp.*prv.*gdp"):
        PrivacyLedger([(1.0, 0.1, 1)]).epsilon(1e-5, accountant="moments")
    with pytest.raises(ValueError, match="delta"):
        epsilon_for([(1.0, 0.1, 1)], 0.0)


@pytest.mark.parametrize("accountant", ["pld", "rdp", "gdp"])
def test_epsilon_increases_with_steps(accountant):
    ledger, previous = PrivacyLedger(), 0.0
    for _ in range(6):
        ledger.record(1.2, 0.02, steps=50)
        current = ledger.epsilon(1e-5, accountant)
        assert current > previous
        previous = current


# ------------------------------------------------------------------------------------------ calibration, budget


@pytest.mark.parametrize(
    ("target", "q", "steps", "accountant"),
    [(1.0, 0.01, 1000, "rdp"), (3.0, 0.004, 3750, "rdp"), (10.0, 0.1, 50, "rdp"), (2.0, 0.02, 500, "pld")]
    + [(3.0, 0.01, 100, "prv")],
)
def test_calibrated_noise_meets_the_target(target, q, steps, accountant):
    sigma = calibrate_noise_multiplier(target, 1e-5, q, steps, accountant=accountant)
    assert target * (1 - 0.005) <= epsilon_for([(sigma, q, steps)], 1e-5, accountant) <= target


@pytest.mark.parametrize(("target", "q", "steps"), [(1e-6, 0.01, 10000), (1.0, 0.5, 0), (1e9, 1e-6, 1)])
def test_unreachable_target_epsilon_raises(target, q, steps):
    with pytest.raises(ValueError, match="target_epsilon"):
        calibrate_noise_multiplier(target, 1e-5, q, steps)


@pytest.mark.parametrize(
    ("budget", "sigma", "q", "accountant", "history"),
    [
        (3.0, 1.0, 0.01, "rdp", ()),
        (2.0, 0.8, 0.005, "rdp", [(1.2, 0.005, 300)]),
        (8.0, 0.7, 0.05, "rdp", ()),
        (3.0, 1.0, 0.01, "pld", ()),
        (2.0, 1.5, 0.02, "pld", [(1.5, 0.02, 40)]),
    ],
)
def test_max_steps_within_budget_is_the_last_affordable_step(budget, sigma, q, accountant, history):
    """Exact for rdp; within BUDGET_REL_TOL below the last affordable step for pld (never above the budget)."""
    steps = max_steps_within_budget(budget, 1e-5, sigma, q, accountant=accountant, history=history)
    slack = 0 if accountant == "rdp" else int(BUDGET_REL_TOL * steps)
    assert steps > 0
    assert epsilon_for([*history, (sigma, q, steps)], 1e-5, accountant) <= budget
    assert epsilon_for([*history, (sigma, q, steps + slack + 1)], 1e-5, accountant) > budget


def test_max_steps_is_zero_when_one_step_is_too_many():
    assert max_steps_within_budget(0.5, 1e-5, 0.5, 0.5) == 0
    assert max_steps_within_budget(1.0, 1e-5, 1.0, 0.01, history=[(0.3, 0.5, 100)]) == 0


@pytest.mark.parametrize(("n", "expected"), [(1, 0.1), (10, 1e-2), (1293, 1e-5), (60000, 1e-6), (100000, 1e-6)])
def test_default_delta(n, expected):
    assert default_delta(n) == expected
    assert default_delta(n) <= 1 / (10 * n) < 10 * default_delta(n)


def test_default_delta_rejects_non_positive_sizes():
    for bad in (0, -5, 2.5, True):
        with pytest.raises(ValueError, match="num_examples"):
            default_delta(bad)


# ------------------------------------------------------------------------------------------------- properties

ORDERS = (1.5, 2.0, 3.5, 8.0, 32.0)


@settings(max_examples=30, deadline=None)
@given(
    q=st.floats(1e-4, 0.99),
    q_factor=st.floats(1.01, 5.0),
    sigma=st.floats(0.5, 20.0),
    sigma_factor=st.floats(1.01, 5.0),
    steps=st.integers(1, 10**5),
)
def test_rdp_is_monotone(q, q_factor, sigma, sigma_factor, steps):
    base = compute_rdp(q, sigma, steps, ORDERS)
    assert np.all(compute_rdp(min(1.0, q * q_factor), sigma, steps, ORDERS) >= base * (1 - 1e-9))
    assert np.all(compute_rdp(q, sigma, steps + 1, ORDERS) >= base)
    assert np.all(compute_rdp(q, sigma * sigma_factor, steps, ORDERS) <= base * (1 + 1e-9))
