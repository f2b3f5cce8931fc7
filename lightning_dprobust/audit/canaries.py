"""Empirical lower bound on epsilon from ONE training run with canaries.

Steinke, Nasr, Jagielski 2023, "Privacy Auditing with One (1) Training Run" (https://arxiv.org/abs/2305.08846).
The auditor draws ``m`` canaries, includes each independently with probability 1/2, trains once, scores every
canary, and guesses "in" for the ``k_plus`` highest scores and "out" for the ``k_minus`` lowest (abstaining on the
rest). If the training algorithm is ``(epsilon, delta)``-DP with respect to adding or removing one example, the number
``W`` of correct guesses out of ``r = k_plus + k_minus`` satisfies, for every ``v``
(their Theorem 5.2, the approximate-DP form of their main theorem; ``delta = 0`` gives the pure-DP form; the formula
is stated here in full so it can be checked against the paper)::

    P[W >= v] <= f(v) + 2 m delta * max_{i = 1..v} (f(v - i) - f(v)) / i,
    f(v) = P[Binomial(r, q) >= v],   q = e^epsilon / (1 + e^epsilon).

The right-hand side is a p-value for the hypothesis "the algorithm is (epsilon, delta)-DP". The lower bound at
confidence ``1 - beta`` is the first epsilon at which that p-value exceeds beta, so every epsilon below it is rejected
(the pure-DP term increases with epsilon; the delta term need not, hence "first"). Choosing ``(k_plus, k_minus)``
after seeing the scores needs a correction: :func:`audit_guesses` searches a fixed grid of ``G`` choices with a union
(Bonferroni) bound, testing each at ``beta / G``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import optimize, special, stats

DEFAULT_GUESS_FRACTIONS = (0.05, 0.1, 0.2, 0.35, 0.5, 0.75, 1.0)
"""Fractions of the canaries guessed by :func:`audit_guesses`, half "in" and half "out" (a grid of 7: beta / 7)."""
_MAX_EPSILON = 100.0
_SCAN_POINTS = 256


def one_run_p_values(m: int, r: int, v: int, epsilons: np.ndarray, delta: float = 0.0) -> np.ndarray:
    """P-values of ``v`` correct guesses out of ``r`` (``m`` canaries) under ``(epsilon, delta)``-DP, per epsilon.

    The bound of Steinke et al. 2023, Theorem 5.2 (module docstring), capped at 1, for each entry of ``epsilons``.

    Raises:
        ValueError: unless ``0 <= v <= r <= m``, every epsilon ``>= 0`` and ``0 <= delta <= 1``.
    """
    epsilons = np.atleast_1d(np.asarray(epsilons, dtype=np.float64))
    if not (0 <= v <= r <= m) or (epsilons < 0).any() or not 0 <= delta <= 1:
        raise ValueError(
            f"need 0 <= v <= r <= m, epsilon >= 0 and delta in [0, 1]; got {v=}, {r=}, {m=}, {epsilons=}, {delta=}"
        )
    q = special.expit(epsilons)
    tail = stats.binom.sf(v - 1, r, q)  # f(v) = P[Binomial(r, q) >= v]
    if delta == 0 or v == 0:
        return np.minimum(tail, 1.0)
    shifts = np.arange(1, v + 1)[:, None]
    gaps = stats.binom.sf(v - shifts - 1, r, q[None, :]) - tail[None, :]  # f(v - i) - f(v)
    return np.minimum(tail + 2 * m * delta * np.max(gaps / shifts, axis=0), 1.0)


def one_run_p_value(m: int, r: int, v: int, epsilon: float, delta: float = 0.0) -> float:
    """:func:`one_run_p_values` at a single ``epsilon``."""
    return float(one_run_p_values(m, r, v, np.array([epsilon]), delta)[0])


def epsilon_lower_bound(m: int, r: int, v: int, beta: float = 0.05, delta: float = 0.0) -> float:
    """Largest epsilon that ``v`` correct guesses out of ``r`` (``m`` canaries) reject at confidence ``1 - beta``.

    With ``delta = 0`` the p-value increases with epsilon and the bound is its crossing of ``beta`` (root finding to
    ``1e-6``). With ``delta > 0`` the delta term need not be monotone, so the bound is the *first* crossing: the
    p-value is scanned on 256 points below the pure-DP bound (beyond which the pure term alone exceeds ``beta``)
    and the first bracket is refined; every epsilon below the result is then rejected too. Returns 0 when even
    ``epsilon = 0`` is not rejected; at most 100.

    Example:
        All 10 guesses correct, pure DP: ``q^10 <= 0.05`` gives ``epsilon = logit(0.05^(1/10)) = 1.0519``.

        >>> round(epsilon_lower_bound(m=10, r=10, v=10, beta=0.05), 4)
        1.0519
    """
    if not 0 < beta < 1:
        raise ValueError(f"beta must lie in (0, 1) (one minus the confidence), got {beta}")

    def excess(epsilon: float, hypothesis_delta: float) -> float:
        return beta - one_run_p_value(m, r, v, epsilon, hypothesis_delta)

    if excess(0.0, delta) <= 0:
        return 0.0
    if excess(_MAX_EPSILON, 0.0) > 0:
        upper = _MAX_EPSILON
    else:
        upper = float(optimize.brentq(excess, 0.0, _MAX_EPSILON, args=(0.0,), xtol=1e-6))
    if delta == 0:
        return upper
    grid = np.linspace(0.0, upper, _SCAN_POINTS + 1)
    rejected = one_run_p_values(m, r, v, grid, delta) <= beta
    first_kept = int(np.argmin(rejected)) if not rejected.all() else len(grid)
    if first_kept == len(grid):
        return upper
    low, high = grid[first_kept - 1], grid[first_kept]
    return float(optimize.brentq(excess, low, high, args=(delta,), xtol=1e-6))


def guess_membership(scores: np.ndarray, k_plus: int, k_minus: int) -> np.ndarray:
    """Guesses ``+1`` (in) for the ``k_plus`` highest scores, ``-1`` (out) for the ``k_minus`` lowest, else ``0``.

    Ties are broken by position (a stable sort), which does not depend on membership.
    """
    scores = np.asarray(scores, dtype=np.float64)
    if k_plus < 0 or k_minus < 0 or k_plus + k_minus > len(scores):
        raise ValueError(
            f"need k_plus, k_minus >= 0 with k_plus + k_minus <= {len(scores)} canaries, got {k_plus} and {k_minus}"
        )
    order = np.argsort(-scores, kind="stable")
    guesses = np.zeros(len(scores), dtype=np.int64)
    guesses[order[:k_plus]] = 1
    guesses[order[len(scores) - k_minus :]] = -1
    return guesses


@dataclass(frozen=True)
class OneRunAudit:
    """The result of :func:`audit_guesses`.

    Attributes:
        epsilon_lower_bound: the largest epsilon rejected at confidence ``1 - beta`` (union bound included).
        k_plus: "in" guesses of the chosen candidate.
        k_minus: "out" guesses of the chosen candidate.
        correct: correct guesses ``v`` of the chosen candidate, out of ``k_plus + k_minus``.
        num_canaries: ``m``.
        num_candidates: ``G``, the size of the grid searched; each candidate was tested at ``beta / G``.
        beta: the overall failure probability.
        delta: the delta of the tested hypothesis.
    """

    epsilon_lower_bound: float
    k_plus: int
    k_minus: int
    correct: int
    num_canaries: int
    num_candidates: int
    beta: float
    delta: float

    @property
    def guesses(self) -> int:
        """``r = k_plus + k_minus``."""
        return self.k_plus + self.k_minus


def guess_grid(num_canaries: int, fractions: Sequence[float] = DEFAULT_GUESS_FRACTIONS) -> list[tuple[int, int]]:
    """Distinct symmetric ``(k_plus, k_minus)`` choices guessing each fraction of ``num_canaries`` (at least 1 each)."""
    grid = []
    for fraction in fractions:
        if not 0 < fraction <= 1:
            raise ValueError(f"guess fractions must lie in (0, 1], got {fraction}")
        half = max(1, int(fraction * num_canaries) // 2)
        candidate = (half, min(half, num_canaries - half))
        if candidate not in grid:
            grid.append(candidate)
    return grid


def audit_guesses(
    scores: np.ndarray,
    included: np.ndarray,
    candidates: Sequence[tuple[int, int]] | None = None,
    beta: float = 0.05,
    delta: float = 0.0,
) -> OneRunAudit:
    """Epsilon lower bound from canary ``scores`` (higher: more likely in) and the true inclusion bits.

    Every ``(k_plus, k_minus)`` in ``candidates`` (default :func:`guess_grid`) is tested at ``beta / len(candidates)``
    and the largest bound is returned: by the union bound the result is a valid lower bound at confidence
    ``1 - beta`` although the best candidate was picked after seeing the guesses. A single candidate needs no
    correction.

    Assumptions: each canary was included independently with probability 1/2, and the scores were computed without
    looking at ``included``.
    """
    scores, included = np.asarray(scores, dtype=np.float64), np.asarray(included, dtype=bool)
    if scores.shape != included.shape or scores.ndim != 1 or len(scores) < 2:
        raise ValueError(f"scores {scores.shape} and included {included.shape} must be 1-d, of one length >= 2")
    candidates = list(candidates or guess_grid(len(scores)))
    truth = np.where(included, 1, -1)
    best = None
    for k_plus, k_minus in candidates:
        correct = int((guess_membership(scores, k_plus, k_minus) == truth).sum())
        bound = epsilon_lower_bound(len(scores), k_plus + k_minus, correct, beta / len(candidates), delta)
        if best is None or bound > best.epsilon_lower_bound:
            best = OneRunAudit(bound, k_plus, k_minus, correct, len(scores), len(candidates), beta, delta)
    return best


def flipped_labels(labels: np.ndarray, num_classes: int, rng: np.random.Generator) -> np.ndarray:
    """Each label replaced by a uniformly random *different* class (so no canary keeps its true label)."""
    labels = np.asarray(labels)
    if num_classes < 2:
        raise ValueError(f"flipping labels needs at least 2 classes, got {num_classes}")
    shift = rng.integers(1, num_classes, size=len(labels))
    return (labels + shift) % num_classes


def choose_canaries(
    pool_size: int, num_canaries: int, num_classes: int, labels: np.ndarray, seed: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Draw canaries from a pool of examples that is disjoint from the training set.

    Returns ``(pool_indices, canary_labels, included)``: ``num_canaries`` distinct indices into the pool, their
    flipped labels (:func:`flipped_labels`) and independent fair coins saying which canaries join the training set.
    A mislabeled example is the strongest black-box canary on a small dataset: when left out the model predicts its
    true class, so its canary label has a high loss; when included, a model that memorizes it gives that label a low
    loss. A label drawn uniformly at random would equal the true label with probability ``1 / num_classes`` and
    carry no signal then.
    """
    if not 1 <= num_canaries <= pool_size:
        raise ValueError(f"the number of canaries must lie in [1, {pool_size}] (the held-out pool), got {num_canaries}")
    rng = np.random.default_rng(seed)
    indices = np.sort(rng.choice(pool_size, size=num_canaries, replace=False))
    canary_labels = flipped_labels(np.asarray(labels)[indices], num_classes, rng)
    included = rng.random(num_canaries) < 0.5
    return indices, canary_labels, included
