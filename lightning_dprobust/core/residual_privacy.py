"""Privacy and generalization calculators of residual perturbation (Tao, Ling, Shi, Wang, "Deep Learning with Data
Privacy via Residual Perturbation", ICLR 2021 submission, OpenReview eNSpdJeR_J; arXiv 2408.05723).

Every epsilon here is **nominal**: Theorems 1 and 2 rest on assumptions that a trained network does not meet
(Gaussian residual outputs with bounded means; gradients treated as post-processing of noisy activations, although
they depend on the example's label and are not clipped; BatchNorm couples the examples of a batch). The numbers
are reported next to an empirical membership audit, never as a differential-privacy guarantee.

Both theorems share one shape of condition, ``noise > bound * sqrt(2 * scale * alpha / (lam * epsilon))`` with
``alpha = log(1/delta) / ((1 - lam) * epsilon) + 1``; with ``c = 2 * bound^2 * scale / noise^2`` it holds iff
``(lam / c) * epsilon^2 - epsilon - log(1/delta) / (1 - lam) > 0``. Minimising the positive root over
``lam in (0, 1)`` gives the closed form ``epsilon* = c + 2 * sqrt(c * log(1/delta))``.

The module imports only the standard library and numpy.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

PAPER_BOUND = 30.0
"""``G = R = 30``: the bounds on the residual outputs and the inputs used for the paper's budgets (section 4.6)."""


def _check_positive(name: str, value: float, allow_zero: bool = False) -> float:
    value = float(value)
    if not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
        relation = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"{name}={value!r} must be a finite number {relation}")
    return value


def _check_unit(name: str, value: float) -> float:
    if not 0 < value < 1:
        raise ValueError(f"{name}={value!r} must lie in (0, 1)")
    return float(value)


def _renyi_order(epsilon: float, delta: float, lam: float) -> float:
    """``alpha = log(1/delta) / ((1 - lam) * epsilon) + 1`` of both theorems."""
    return math.log(1 / delta) / ((1 - lam) * epsilon) + 1


def _noise_floor(bound: float, scale: float, epsilon: float, delta: float, lam: float) -> float:
    """Smallest noise std ``bound * sqrt(2 * scale * alpha / (lam * epsilon))`` meeting the condition."""
    alpha = _renyi_order(epsilon, delta, lam)
    return bound * math.sqrt(2 * scale * alpha / (lam * epsilon))


def _cost(noise: float, bound: float, scale: float) -> float:
    """``c = 2 * bound^2 * scale / noise^2`` (``inf`` without noise)."""
    return math.inf if noise == 0 else 2 * bound**2 * scale / noise**2


def smallest_epsilon(cost: float, delta: float) -> float:
    """``epsilon* = c + 2 sqrt(c log(1/delta))``: the smallest epsilon any ``lam in (0, 1)`` certifies for cost ``c``.

    It is the minimum over ``lam`` of :func:`epsilon_at_lambda` (the optimal Renyi order is
    ``1 + sqrt(log(1/delta) / c)``).
    """
    _check_unit("delta", delta)
    if math.isinf(cost):
        return math.inf
    return cost + 2 * math.sqrt(cost * math.log(1 / delta))


def epsilon_at_lambda(cost: float, delta: float, lam: float) -> float:
    """The epsilon certified for one split ``lam``: the positive root of ``(lam/c) e^2 - e - log(1/delta)/(1-lam)``."""
    _check_unit("delta", delta)
    _check_unit("lam", lam)
    if math.isinf(cost):
        return math.inf
    k = lam / cost
    log_term = math.log(1 / delta) / (1 - lam)
    return (1 + math.sqrt(1 + 4 * k * log_term)) / (2 * k)


def grid_epsilon(cost: float, delta: float, lams: Sequence[float] | None = None) -> float:
    """Minimum of :func:`epsilon_at_lambda` over a grid of ``lam`` (an independent check of the closed form)."""
    grid = np.linspace(1e-4, 1 - 1e-4, 20001) if lams is None else np.asarray(lams, dtype=float)
    return min(epsilon_at_lambda(cost, delta, float(lam)) for lam in grid)


def theorem1_epsilon(
    gamma: float,
    epochs: float,
    delta: float,
    bound_g: float = PAPER_BOUND,
    input_noise: float | None = None,
    bound_r: float = PAPER_BOUND,
) -> float:
    """Nominal epsilon of Strategy I after ``epochs = T b / N`` passes (Theorem 1; NOT a DP guarantee).

    Theorem 1 asks ``gamma > G sqrt(2 T b alpha / (N lam eps))`` and ``pi > R sqrt(2 T b alpha / (N lam eps))``.
    The paper's budgets (1.1e5 for IDC, 3e5 for CIFAR-10) use the ``gamma`` condition only; pass ``input_noise``
    (``pi``) to enforce the input condition as well, which binds when ``pi = gamma / 2`` and ``R = G``.

    Args:
        gamma: std of the noise added after every residual block, >= 0 (0 gives ``inf``).
        epochs: ``T b / N``, the number of passes over the data, >= 0.
        delta: the ``delta`` of the claim, in (0, 1).
        bound_g: ``G``, the assumed bound on each residual output's mean (l2).
        input_noise: ``pi``, the std of the input noise; ``None`` leaves the input condition out.
        bound_r: ``R``, the assumed radius of the inputs.

    Example:
        >>> round(theorem1_epsilon(0.75, epochs=100, delta=1e-5) / 1e5, 2)
        3.24
    """
    gamma, epochs = _check_positive("gamma", gamma, True), _check_positive("epochs", epochs, True)
    cost = _cost(gamma, _check_positive("bound_g", bound_g), epochs)
    if input_noise is not None:
        pi = _check_positive("input_noise", input_noise, True)
        cost = max(cost, _cost(pi, _check_positive("bound_r", bound_r), epochs))
    return 0.0 if epochs == 0 else smallest_epsilon(cost, delta)


def theorem1_noise_floors(
    epsilon: float, delta: float, lam: float, epochs: float, bound_g: float = PAPER_BOUND, bound_r: float = PAPER_BOUND
) -> tuple[float, float]:
    """``(gamma_min, pi_min)`` of Theorem 1 for a target ``epsilon`` and split ``lam``."""
    epsilon, epochs = _check_positive("epsilon", epsilon), _check_positive("epochs", epochs)
    _check_unit("delta", delta), _check_unit("lam", lam)
    return (_noise_floor(bound_g, epochs, epsilon, delta, lam), _noise_floor(bound_r, epochs, epsilon, delta, lam))


def theorem2_noise_floors(
    epsilon: float, delta: float, lam: float, num_blocks: int, bound_b: float, eta: float, weight_norm: float
) -> tuple[float, float]:
    """``(gamma_min, pi_min)`` of Theorem 2 (Strategy II, per black-box query; NOT a guarantee on training).

    ``gamma > (B / eta) sqrt(2 alpha M / (lam eps))`` and ``pi > a sqrt(2 alpha M / (lam eps))``, with ``M`` residual
    blocks, ``B`` the bound of the BatchNorm-ed residual mappings, ``eta`` the floor of ``|x|`` in the
    multiplicative noise and ``a`` the bound on the last layer's weight norm.
    """
    epsilon, eta = _check_positive("epsilon", epsilon), _check_positive("eta", eta)
    _check_unit("delta", delta), _check_unit("lam", lam)
    if num_blocks < 1:
        raise ValueError(f"num_blocks={num_blocks!r} must be >= 1 (the residual blocks M)")
    gamma_min = _noise_floor(_check_positive("bound_b", bound_b) / eta, num_blocks, epsilon, delta, lam)
    return gamma_min, _noise_floor(_check_positive("weight_norm", weight_norm), num_blocks, epsilon, delta, lam)


def theorem2_epsilon(
    gamma: float, output_noise: float, eta: float, num_blocks: int, bound_b: float, weight_norm: float, delta: float
) -> float:
    """Nominal per-query epsilon of Theorem 2 (``inf`` unless ``eta > 0`` and the output noise ``pi > 0``)."""
    gamma, eta = _check_positive("gamma", gamma, True), _check_positive("eta", eta, True)
    pi = _check_positive("output_noise", output_noise, True)
    if num_blocks < 1:
        raise ValueError(f"num_blocks={num_blocks!r} must be >= 1 (the residual blocks M)")
    block_cost = _cost(gamma * eta, _check_positive("bound_b", bound_b), num_blocks)
    head_cost = _cost(pi, _check_positive("weight_norm", weight_norm), num_blocks)
    return smallest_epsilon(max(block_cost, head_cost), delta)


def theorem3_ratio(gamma: float, p: float, horizon: float = 1.0) -> float:
    """``R(G) / R(F) = exp(-p (1 - p) gamma^2 T / 2)``: Theorem 3's shrinkage of the Rademacher complexity.

    ``G`` is the noise-averaged (ensemble) class of the linear ODE with multiplicative noise ``gamma``, ``F`` the
    noiseless class, ``0 < p < 1`` the power that makes ``x^p`` well defined and ``T`` the time horizon.
    """
    gamma, horizon = _check_positive("gamma", gamma, True), _check_positive("horizon", horizon, True)
    _check_unit("p", p)
    return math.exp(-p * (1 - p) * gamma**2 * horizon / 2)
