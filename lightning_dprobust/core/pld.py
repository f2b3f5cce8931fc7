"""Tight epsilon of DP-SGD with privacy loss distributions (PLD), through Google's ``dp_accounting``.

The privacy loss distribution of each Poisson-subsampled Gaussian step (Koskela, Jalko, Honkela 2020,
https://arxiv.org/abs/1906.03049; Doroshenko, Ghazi, Kamath, Kumar, Manurangsi 2022, "Connect the dots",
https://arxiv.org/abs/2207.04380) is discretized *pessimistically* (every privacy loss rounded up, the truncated tail
mass counted as infinite loss) and composed by FFT convolution. The result is an upper bound on the epsilon of the
exact mechanism, for the add-or-remove-one neighbouring relation, tight up to the discretization: composing ``T``
steps over-estimates the privacy loss by at most ``T`` discretization intervals in the worst case, in practice far
less (a few thousandths of epsilon at the interval used here, checked in the tests against a 10x finer one).

Assumptions: each step is a Gaussian mechanism of L2 sensitivity 1 with noise ``noise_multiplier`` on a Poisson
sample of rate ``sample_rate`` (as :class:`~lightning_dprobust.core.accounting.PrivacyEvent` states), and the steps
compose adaptively.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Protocol

VALUE_DISCRETIZATION_INTERVAL = 1e-3
"""Width of the grid of privacy-loss values: larger is faster and looser, never invalid."""


class GaussianSteps(Protocol):
    """What the PLD accountant reads from an event: ``steps`` steps of ``noise_multiplier`` at ``sample_rate``."""

    noise_multiplier: float
    sample_rate: float
    steps: int


def pld_epsilon(
    events: Sequence[GaussianSteps], delta: float, value_discretization_interval: float = VALUE_DISCRETIZATION_INTERVAL
) -> float:
    """Epsilon at ``delta`` of the composition of ``events`` (oldest first), by privacy loss distributions.

    Returns:
        A valid upper bound on the epsilon of the mechanism (see the module docstring); 0.0 for no steps.

    Raises:
        ValueError: ``value_discretization_interval`` is not a positive finite number.
    """
    import dp_accounting
    from dp_accounting import pld

    if not (math.isfinite(value_discretization_interval) and value_discretization_interval > 0):
        raise ValueError(f"value_discretization_interval={value_discretization_interval!r} must be a number > 0")
    steps = [
        dp_accounting.SelfComposedDpEvent(
            dp_accounting.PoissonSampledDpEvent(e.sample_rate, dp_accounting.GaussianDpEvent(e.noise_multiplier)),
            e.steps,
        )
        for e in events
        if e.steps > 0
    ]
    if not steps:
        return 0.0
    accountant = pld.PLDAccountant(
        neighboring_relation=dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE,
        value_discretization_interval=value_discretization_interval,
    )
    accountant.compose(dp_accounting.ComposedDpEvent(steps))
    return max(0.0, float(accountant.get_epsilon(delta)))


__all__ = ["VALUE_DISCRETIZATION_INTERVAL", "pld_epsilon"]
