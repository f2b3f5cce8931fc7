"""Noise calibration for a target epsilon and the step budget of an epsilon budget (DP-SGD planning).

Both search over the guaranteed accountants of :mod:`lightning_dprobust.core.accounting` (pld, prv, rdp), using that
epsilon is decreasing in the noise multiplier and non-decreasing in the number of steps. The ``"gdp"`` approximation
is refused: a target or budget met under it can be exceeded by the true epsilon.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

from lightning_dprobust.core.accounting import (
    DEFAULT_ACCOUNTANT,
    DEFAULT_RDP_ORDERS,
    PrivacyEvent,
    PrivacyLedger,
    _check_delta,
    check_guaranteed_accountant,
    compute_rdp,
    epsilon_for,
    rdp_to_epsilon,
)

_MAX_NOISE_MULTIPLIER = 1e4
_MIN_NOISE_MULTIPLIER = 1e-3
_MAX_BUDGET_STEPS = 1 << 40
BUDGET_REL_TOL = 1e-3
"""How far below the largest affordable number of steps the pld and prv budget searches may stop."""


def calibrate_noise_multiplier(
    target_epsilon: float,
    delta: float,
    sample_rate: float,
    steps: int,
    accountant: str = DEFAULT_ACCOUNTANT,
    rel_tol: float = 0.005,
    history: Iterable[PrivacyEvent | Sequence[Any]] = (),
) -> float:
    """Noise multiplier whose ``steps`` steps at ``sample_rate`` spend at most ``target_epsilon`` at ``delta``.

    With ``history`` (the events already recorded, e.g. by a resumed run), the bound holds for the composition of
    ``history`` followed by the ``steps`` new steps.

    Doubles ``sigma`` from 1 until the target is met, then bisects (epsilon decreases in ``sigma``), like Opacus'
    ``get_noise_multiplier``. The result satisfies ``target_epsilon * (1 - rel_tol) <= epsilon(sigma) <=
    target_epsilon`` under ``accountant`` (only the upper bound if epsilon jumps, as PRV's numerics may); report
    epsilon with the same accountant.

    Raises:
        ValueError: when ``steps == 0``, the target needs ``sigma > 1e4`` (or ``sigma < 1e-3``), or ``accountant`` is
            the ``"gdp"`` approximation.
    """
    check_guaranteed_accountant(accountant, "calibrating the noise to target_epsilon")
    if not (math.isfinite(target_epsilon) and target_epsilon > 0):
        raise ValueError(f"target_epsilon={target_epsilon!r} must be a finite number > 0")
    if not 0 < rel_tol < 1:
        raise ValueError(f"rel_tol={rel_tol!r} must lie in (0, 1)")
    PrivacyEvent(1.0, sample_rate, steps)  # validates sample_rate and steps
    if steps == 0:
        raise ValueError(
            f"target_epsilon={target_epsilon} cannot calibrate a noise multiplier for steps=0: "
            "any noise spends epsilon 0; pass the number of planned steps"
        )

    past = PrivacyLedger(history).history

    def epsilon_of(sigma: float) -> float:
        return epsilon_for([*past, (sigma, sample_rate, steps)], delta, accountant)

    lo, hi, eps_hi = 0.0, 1.0, epsilon_of(1.0)
    while eps_hi > target_epsilon:
        if hi >= _MAX_NOISE_MULTIPLIER:
            raise ValueError(
                f"target_epsilon={target_epsilon} is unreachable: even noise_multiplier={hi:g} spends "
                f"epsilon={eps_hi:.4g}; raise target_epsilon or delta, or lower sample_rate or steps"
            )
        lo, hi, eps_hi = hi, 2 * hi, epsilon_of(2 * hi)
    while eps_hi < target_epsilon * (1 - rel_tol) and hi - lo > 1e-12 * hi:
        if hi < _MIN_NOISE_MULTIPLIER:
            raise ValueError(
                f"target_epsilon={target_epsilon} is so large that noise_multiplier={hi:g} stays within it; "
                "lower target_epsilon or set noise_multiplier directly"
            )
        mid = 0.5 * (lo + hi)
        eps_mid = epsilon_of(mid)
        if eps_mid <= target_epsilon:
            hi, eps_hi = mid, eps_mid
        else:
            lo = mid
    return hi


def _epsilon_after(
    past: Sequence[PrivacyEvent], noise_multiplier: float, sample_rate: float, delta: float, accountant: str
) -> Callable[[int], float]:
    """``n -> epsilon`` of ``past`` followed by ``n`` steps; for RDP the per-step vector is computed once."""
    step = PrivacyEvent(noise_multiplier, sample_rate, 1)
    if accountant != "rdp":
        return lambda n: epsilon_for([*past, (noise_multiplier, sample_rate, n)], delta, accountant)
    delta = _check_delta(delta)
    rdp_past = sum((compute_rdp(e.sample_rate, e.noise_multiplier, e.steps) for e in past), np.zeros(1))
    rdp_step = compute_rdp(step.sample_rate, step.noise_multiplier, 1)
    return lambda n: rdp_to_epsilon(DEFAULT_RDP_ORDERS, rdp_past + n * rdp_step, delta)[0]


def max_steps_within_budget(
    epsilon_budget: float,
    delta: float,
    noise_multiplier: float,
    sample_rate: float,
    accountant: str = DEFAULT_ACCOUNTANT,
    history: Iterable[PrivacyEvent | Sequence[Any]] = (),
) -> int:
    """Largest ``n`` such that ``history`` followed by ``n`` steps of ``(noise_multiplier, sample_rate)`` spends
    at most ``epsilon_budget`` at ``delta``; 0 if even one more step exceeds it.

    Exponential then binary search, assuming epsilon is non-decreasing in the number of steps (true for every
    accountant here). With ``"rdp"`` (milliseconds per evaluation) the result is exactly the largest ``n``. With
    ``"pld"`` and ``"prv"`` (up to seconds per evaluation) the search starts from the RDP answer, which they never
    fall short of, and stops within ``BUDGET_REL_TOL`` (0.1 %) below the largest ``n``: never above the budget.
    Refuses the ``"gdp"`` approximation with ``ValueError``.
    """
    check_guaranteed_accountant(accountant, "an epsilon_budget")
    if not (epsilon_budget >= 0 and math.isfinite(epsilon_budget)):
        raise ValueError(f"epsilon_budget={epsilon_budget!r} must be a finite number >= 0")
    past = PrivacyLedger(history).history
    epsilon_after = _epsilon_after(past, noise_multiplier, sample_rate, delta, accountant)

    def within(extra: int) -> bool:
        return epsilon_after(extra) <= epsilon_budget

    start, tolerance = 1, 0.0
    if accountant != "rdp":
        rdp_steps = max_steps_within_budget(epsilon_budget, delta, noise_multiplier, sample_rate, "rdp", past)
        start, tolerance = (rdp_steps if rdp_steps > 1 and within(rdp_steps) else 1), BUDGET_REL_TOL
    if not within(start):
        return 0
    good, bad = start, 2 * start
    while within(bad):
        if bad >= _MAX_BUDGET_STEPS:
            raise ValueError(f"epsilon_budget={epsilon_budget} allows more than {bad} steps; it is no real limit")
        good, bad = bad, 2 * bad
    while bad - good > max(1, int(tolerance * good)):
        mid = (good + bad) // 2
        good, bad = (mid, bad) if within(mid) else (good, mid)
    return good
