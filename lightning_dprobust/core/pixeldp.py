"""PixelDP certified robustness: confidence bounds on expected scores, the robustness size and the certified radius.

PixelDP: Lecuyer, Atlidakis, Geambasu, Hsu and Jana (2019), "Certified Robustness to Adversarial Examples with
Differential Privacy", IEEE S&P, https://arxiv.org/abs/1802.03471. Composition over an input and a latent
mechanism (Lemma 5, Theorem 5, Corollary 1, Eq. 13, Algorithm 3): Phan, Thai, Hu, Jin, Sun and Dou (2020),
"Scalable Differential Privacy with Certified Robustness in Adversarial Learning" (StoBatch), ICML,
https://arxiv.org/abs/1903.09822.

A randomized scoring function ``f`` with values in ``[0, 1]^K`` that is ``epsilon_r``-DP with respect to every
input perturbation in a ball satisfies ``E f_k(x) <= e^{epsilon_r} E f_k(x + alpha)`` for every class ``k`` and
every ``alpha`` in the ball. Hence if ``E_lb f_k(x) > e^{2 epsilon_r} max_{i != k} E_ub f_i(x)`` (Eq. 12), no
perturbation in the ball changes ``argmax E f``. The expectations are estimated from ``n`` independent draws, with
confidence bounds that hold jointly with probability at least ``1 - eta``: ``eta`` is the failure probability
(PixelDP's ``eta``, 0.05 in its code and in StoBatch's; the paper's "probability >= eta" is ``1 - eta`` here).

Two conditions (the readings settled for StoBatch):

* ``"paper"``: PixelDP's code. Bonferroni over the ``K`` classes (each one-sided bound fails with probability
  ``eta / K``); the radius is ``epsilon_r* * scale`` where ``scale`` is the mechanism's Eq. 13 factor for the unit
  l_inf ball. (StoBatch's released code evaluates ``Delta_r^x`` at the attack size, ``mu_a d``, and still compares
  the result with ``mu_a``, which mixes units and is more lenient for ``mu_a < 1``; that variant is not offered.)
* ``"strict"``: the two assumptions the paper's code leaves implicit are honoured. The class ``k`` is chosen from the
  same draws that bound it, so all ``2K`` one-sided bounds must hold at once (each fails with probability
  ``eta / (2K)``); and when the fresh inference noise is the training noise shrunk by ``psi`` (StoBatch, Appendix N)
  the randomness that carries the guarantee has scale ``b / psi``, so the radius is ``epsilon_r* * scale / psi``.

In both, an example is robust at attack size ``mu_a`` when its radius is at least ``mu_a`` (Algorithm 3).

What is certified depends on the estimator. ``hoeffding`` bounds the expected scores ``E f_i`` and certifies
``argmax_i E f_i``; ``clopper_pearson`` bounds the vote probabilities ``P(argmax f = i)`` and certifies
``argmax_i P(argmax f = i)``, the classifier the counts predict. Both are valid: a vote is a post-processing of the
mechanisms' joint output, so its expectation obeys the same ``e^{epsilon_r}`` ratio (sequential composition, then
post-processing, as in the proof of Lemma 5).

Everything here is plain torch and scipy, no Lightning.
"""

from __future__ import annotations

import math
from numbers import Integral, Real

import torch
from torch import Tensor

from lightning_dprobust.core.smoothing import lower_confidence_bound

CONDITIONS = ("paper", "strict")
"""Robustness conditions: ``paper`` reproduces PixelDP's and StoBatch's code, ``strict`` is the provable one."""
BOUNDS = ("clopper_pearson", "hoeffding")
"""Estimators: Clopper-Pearson on argmax counts (PixelDP's default) or Hoeffding on expected scores."""


def bonferroni_hypotheses(num_classes: int, condition: str) -> int:
    """Number of one-sided bounds the failure probability ``eta`` is split over: ``K`` (paper) or ``2K`` (strict)."""
    _check_condition(condition)
    if isinstance(num_classes, bool) or not isinstance(num_classes, Integral) or num_classes < 2:
        raise ValueError(f"PixelDP certification needs at least 2 classes, got {num_classes!r}")
    return int(num_classes) if condition == "paper" else 2 * int(num_classes)


def hoeffding_width(n: int, alpha: float) -> float:
    """Half-width ``sqrt(ln(1 / alpha) / (2 n))`` of a one-sided Hoeffding bound on the mean of ``n`` draws.

    Hoeffding (1963): for ``n`` independent draws in ``[0, 1]``, ``P(mean - E >= t) <= exp(-2 n t^2)``, so the mean
    minus (plus) this width is a lower (upper) bound on the expectation that fails with probability at most
    ``alpha``. Assumes the draws are independent and each lies in ``[0, 1]``.
    """
    _check_n(n)
    _check_probability("alpha", alpha)
    return math.sqrt(math.log(1.0 / alpha) / (2.0 * n))


def clopper_pearson_upper(count: int, n: int, alpha: float) -> float:
    """One-sided ``(1 - alpha)`` Clopper-Pearson upper bound on a binomial probability (``1`` when ``count == n``).

    By the symmetry of the beta distribution it is one minus the lower bound on the failure probability, computed by
    :func:`lightning_dprobust.core.smoothing.lower_confidence_bound` (Clopper and Pearson, 1934).
    """
    if isinstance(count, bool) or int(count) != count or not 0 <= count <= n:
        raise ValueError(f"count must be an integer in [0, n={n}], got {count!r}")
    return 1.0 - lower_confidence_bound(n - int(count), n, alpha)


def top_two_bounds(estimate: Tensor, n: int, eta: float, bound: str, condition: str) -> tuple[Tensor, Tensor, Tensor]:
    """Predicted class ``k``, ``E_lb f_k`` and ``max_{i != k} E_ub f_i`` of each example (Lecuyer et al., Sec. IV-C).

    Args:
        estimate: ``[B, K]``; argmax counts out of ``n`` (integers) for ``clopper_pearson``, mean scores in
            ``[0, 1]`` over ``n`` draws for ``hoeffding``.
        n: number of draws behind ``estimate``.
        eta: failure probability of all the bounds together, in ``(0, 1)``.
        bound: one of :data:`BOUNDS`.
        condition: one of :data:`CONDITIONS` (it fixes the Bonferroni correction, see the module docstring).

    Returns:
        ``prediction`` (long ``[B]``, ``argmax`` of ``estimate``, lowest index on ties), ``lower`` and ``upper``
        (float64 ``[B]``, in ``[0, 1]``). Both bounds hold jointly with probability ``>= 1 - eta`` when the draws are
        independent given the input (``strict``; ``paper`` assumes ``k`` fixed in advance).

    Raises:
        ValueError: for an unknown ``bound`` or ``condition``, ``n < 1``, ``eta`` outside ``(0, 1)``, or an
            ``estimate`` of the wrong shape or range.
    """
    check_options(n, eta, bound, condition)
    _check_estimate(estimate, n, bound)
    alpha = eta / bonferroni_hypotheses(estimate.shape[1], condition)
    top2 = estimate.double().topk(2, dim=1)  # the largest upper bound of the others is that of the runner-up
    prediction = estimate.double().argmax(dim=1)
    if bound == "hoeffding":
        width = hoeffding_width(n, alpha)
        return prediction, (top2.values[:, 0] - width).clamp(0.0, 1.0), (top2.values[:, 1] + width).clamp(0.0, 1.0)
    lower = [lower_confidence_bound(int(count), n, alpha) for count in top2.values[:, 0].tolist()]
    upper = [clopper_pearson_upper(int(count), n, alpha) for count in top2.values[:, 1].tolist()]
    return prediction, torch.tensor(lower, dtype=torch.float64), torch.tensor(upper, dtype=torch.float64)


def robustness_size(lower: Tensor, upper: Tensor) -> Tensor:
    """Largest ``epsilon_r`` passing Eq. 12: ``epsilon_r* = ln(lower / upper) / 2``, and ``0`` when not positive.

    Eq. 12 of Phan et al. (2020) (Eq. 4 of Lecuyer et al. with ``delta_r = 0``) holds for ``epsilon_r`` iff
    ``lower > e^{2 epsilon_r} upper``; at ``epsilon_r*`` it holds with equality, so every smaller budget passes.
    ``upper`` is positive for both estimators; ``lower = 0`` gives ``0``.
    """
    if lower.shape != upper.shape:
        raise ValueError(f"lower and upper must have the same shape, got {tuple(lower.shape)} and {tuple(upper.shape)}")
    ratio = torch.where(upper > 0, lower / upper.clamp_min(torch.finfo(upper.dtype).tiny), torch.inf)
    return torch.where(ratio > 1.0, 0.5 * torch.log(ratio), 0.0)


def passes_robustness_check(lower: Tensor, upper: Tensor, epsilon_r: float | Tensor) -> Tensor:
    """Eq. 12 (Theorem 5) at budget ``epsilon_r``: ``lower > e^{2 epsilon_r} upper``, elementwise."""
    return lower > torch.exp(2.0 * torch.as_tensor(epsilon_r, dtype=torch.float64)) * upper


def radius_scale(delta_r_big: float, m: int, epsilon1: float, delta_rx: float, delta_rh: float) -> float:
    """Eq. 13 factor ``Delta_R / (m epsilon1 (Delta_r^x + Delta_r^h / 2))``: certified radius per unit ``epsilon_r``.

    With input noise of scale ``b_x = Delta_R / (m epsilon1)`` and latent noise ``b_h = 2 b_x`` (StoBatch, Sec. 3.1),
    a perturbation of the unit ball moves the input and the first hidden layer by at most ``Delta_r^x`` and
    ``Delta_r^h`` in l1, so the composed mechanism is ``(Delta_r^x / b_x + Delta_r^h / b_h)``-DP per unit of radius
    (Lemma 5); solving for the radius gives this factor (Corollary 1: it equals ``kappa phi / (kappa + phi)`` at
    ``epsilon_r = 1``, see :func:`group_sizes`).
    """
    values = {"Delta_R": delta_r_big, "m": m, "epsilon1": epsilon1, "Delta_r^x": delta_rx}
    for name, value in values.items():
        _check_positive(name, value)
    if not (math.isfinite(delta_rh) and delta_rh >= 0):
        raise ValueError(f"Delta_r^h must be a finite number >= 0, got {delta_rh!r}")
    return delta_r_big / (m * epsilon1 * (delta_rx + delta_rh / 2.0))


def group_sizes(
    epsilon_r: float, delta_r_big: float, m: int, epsilon1: float, delta_rx: float, delta_rh: float
) -> tuple[float, float]:
    """``kappa`` and ``phi`` of Phan et al. (2020), Sec. 3.3: the privacy noise read as PixelDP noise at ``epsilon_r``.

    ``kappa = (Delta_R / (m epsilon1)) / (Delta_r^x / epsilon_r)`` and ``phi = (2 Delta_R / (m epsilon1)) /
    (Delta_r^h / epsilon_r)`` (``inf`` when ``Delta_r^h = 0``); Corollary 1 certifies ``l_p(kappa phi / (kappa +
    phi))``.
    """
    base = delta_r_big / (m * epsilon1)
    kappa = base * epsilon_r / delta_rx
    phi = 2.0 * base * epsilon_r / delta_rh if delta_rh > 0 else math.inf
    return kappa, phi


def certified_radius(epsilon_r: Tensor, scale: float, condition: str, psi: float = 1.0) -> Tensor:
    """Radius ``epsilon_r* * scale`` (paper) or ``epsilon_r* * scale / psi`` (strict), in the units of ``scale``.

    ``psi >= 1`` is the factor by which the fresh inference noise is shrunk relative to the noise ``scale`` was
    computed for (StoBatch, Appendix N; ``1`` when it is not shrunk). The paper mode ignores it, as the paper does.
    """
    _check_condition(condition)
    _check_positive("radius scale", scale)
    _check_psi(psi)
    return epsilon_r * (scale if condition == "paper" else scale / psi)


def check_options(n: int, eta: float, bound: str, condition: str, psi: float = 1.0) -> None:
    """Raise one clear ``ValueError`` unless ``n >= 1``, ``0 < eta < 1``, ``psi >= 1`` and ``bound``, ``condition``
    are known."""
    _check_n(n)
    _check_probability("eta", eta)
    if bound not in BOUNDS:
        raise ValueError(f"bound must be one of {BOUNDS}, got {bound!r}")
    _check_condition(condition)
    _check_psi(psi)


def _check_estimate(estimate: Tensor, n: int, bound: str) -> None:
    if not isinstance(estimate, Tensor) or estimate.dim() != 2 or estimate.shape[1] < 2:
        shape = tuple(estimate.shape) if isinstance(estimate, Tensor) else type(estimate).__name__
        raise ValueError(f"estimate must be a [B, K] tensor with K >= 2 classes, got {shape}")
    if bound == "clopper_pearson":
        if estimate.is_floating_point() or (estimate < 0).any() or (estimate.sum(1) > n).any():
            raise ValueError(f"clopper_pearson needs integer argmax counts in [0, n={n}] summing to at most n")
    elif not estimate.is_floating_point() or not ((estimate >= 0) & (estimate <= 1)).all():
        raise ValueError("hoeffding needs mean scores: a floating-point tensor with values in [0, 1]")


def _check_condition(condition: str) -> None:
    if condition not in CONDITIONS:
        raise ValueError(f"condition must be one of {CONDITIONS}, got {condition!r}")


def _check_n(n: int) -> None:
    if isinstance(n, bool) or not isinstance(n, Integral) or n < 1:
        raise ValueError(f"n must be an integer >= 1 (Monte-Carlo draws per example), got {n!r}")


def _check_probability(name: str, value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, Real) or not 0.0 < value < 1.0:
        raise ValueError(f"{name} must lie in (0, 1) (a failure probability, e.g. 0.05), got {value!r}")


def _check_psi(psi: float) -> None:
    if isinstance(psi, bool) or not isinstance(psi, Real) or not math.isfinite(psi) or psi < 1:
        raise ValueError(f"psi must be a finite number >= 1 (the fresh-noise shrink factor), got {psi!r}")


def _check_positive(name: str, value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
