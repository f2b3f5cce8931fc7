"""Privacy accounting for the Poisson-subsampled Gaussian mechanism (DP-SGD).

Four accountants turn a history of DP-SGD steps into an ``(epsilon, delta)`` guarantee with respect to adding or
removing one training example. Three are guarantees (upper bounds on the true epsilon):

- ``"pld"`` (the default): privacy loss distributions composed numerically with pessimistic discretization, through
  Google's ``dp_accounting`` (Koskela et al. 2020, https://arxiv.org/abs/1906.03049; Doroshenko et al. 2022,
  https://arxiv.org/abs/2207.04380); see :mod:`lightning_dprobust.core.pld`. Tight (within about 0.01 of the exact
  epsilon), a valid upper bound at every discretization, and fast enough to call every epoch (tens of milliseconds
  for a few thousand steps). Chosen as the default because it reports the smallest epsilon that is still proven.
  Where the RDP bound exceeds ``PLD_EPSILON_CAP`` (50: tiny noise) or the history exceeds ``PLD_MAX_STEPS`` (a
  million steps), where PLD would take gigabytes or minutes, it reports the RDP bound instead.
- ``"prv"``: numerical composition of privacy loss random variables (Gopi, Lee, Wutschitz 2021,
  https://arxiv.org/abs/2106.02848) through Opacus' ``PRVAccountant``. Returns the upper end of an interval
  of width ``eps_error=0.01``, so it is a guarantee up to that numerical error, about as tight as PLD.
  It takes seconds per call: do not call it every step.
- ``"rdp"``: Renyi DP of the subsampled Gaussian mechanism (Mironov, Talwar, Zhang 2019,
  https://arxiv.org/abs/1908.10530), composed additively and converted with Balle et al. 2020, Theorem 21
  (https://arxiv.org/abs/1905.09982). A guaranteed upper bound, looser than PLD and PRV; milliseconds per call.

One is an approximation, never a guarantee:

- ``"gdp"``: mu-Gaussian DP through the central limit theorem for Poisson subsampling (Bu, Dong, Long, Su 2019,
  https://arxiv.org/abs/1911.11607). Asymptotic: it can *underestimate* epsilon (for ``q = 0.01``, ``T = 100``,
  ``sigma = 0.69``, ``delta = 1e-5``: 0.999 against PLD's 2.480), so every gdp value comes with an
  :class:`ApproximateAccountingWarning` and it cannot calibrate noise or bound a budget
  (:func:`check_guaranteed_accountant`). It requires one constant ``(noise_multiplier, sample_rate)``.

The module imports only numpy and scipy; ``dp_accounting`` is imported when the PLD accountant is used, Opacus (and
with it torch) when the PRV accountant is.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np
from scipy import optimize, special

ACCOUNTANTS = ("pld", "rdp", "prv", "gdp")
GUARANTEED_ACCOUNTANTS = ("pld", "prv", "rdp")
"""The accountants whose epsilon is a proven upper bound; ``"gdp"`` is an approximation."""
DEFAULT_ACCOUNTANT = "pld"
DEFAULT_RDP_ORDERS: tuple[float, ...] = tuple([1 + x / 10.0 for x in range(1, 100)] + [float(a) for a in range(12, 64)])

_LOG_TERM_CUTOFF = -30.0  # series terms below exp(-30) are dropped; every A_alpha is >= 1
_MAX_SERIES_TERMS = 1 << 22


@dataclass(frozen=True)
class PrivacyEvent:
    """``steps`` DP-SGD steps, each a Gaussian mechanism with ``noise_multiplier`` on a Poisson sample of rate ``q``.

    Guarantees on construction: ``noise_multiplier`` is a finite float > 0, ``0 < sample_rate <= 1`` and ``steps``
    is an int >= 0; anything else raises ``ValueError``.
    """

    noise_multiplier: float
    sample_rate: float
    steps: int

    def __post_init__(self) -> None:
        sigma, q = float(self.noise_multiplier), float(self.sample_rate)
        if not (math.isfinite(sigma) and sigma > 0):
            raise ValueError(f"noise_multiplier={self.noise_multiplier!r} must be a finite number > 0")
        if not 0 < q <= 1:
            raise ValueError(f"sample_rate={self.sample_rate!r} must lie in (0, 1] (the Poisson sampling probability)")
        if not _is_count(self.steps, minimum=0):
            raise ValueError(f"steps={self.steps!r} must be an int >= 0")
        object.__setattr__(self, "noise_multiplier", sigma)
        object.__setattr__(self, "sample_rate", q)
        object.__setattr__(self, "steps", int(self.steps))


@dataclass(frozen=True)
class NominalEvent:
    """A privacy claim from a heuristic proof (``source`` names it): recorded and reported, never composed.

    A nominal epsilon rests on assumptions the mechanism does not enforce (e.g. residual perturbation's Theorem 1),
    so the ledger keeps it apart (``delta`` in ``(0, 1)``, or ``0`` for a pure-DP claim): it never enters a DP
    epsilon (a ledger holding one reports ``inf``, see :meth:`PrivacyLedger.epsilon`), and it is always reported as
    nominal. A claim covers the whole run so far, so a newer claim from the same ``source`` replaces the older.
    """

    source: str
    epsilon: float
    delta: float

    def __post_init__(self) -> None:
        if not isinstance(self.source, str) or not self.source:
            raise ValueError(f"source={self.source!r} must be a non-empty name of the heuristic claim")
        if not float(self.epsilon) >= 0:
            raise ValueError(f"epsilon={self.epsilon!r} must be a number >= 0 (inf allowed)")
        object.__setattr__(self, "epsilon", float(self.epsilon))
        pure = isinstance(self.delta, int | float) and self.delta == 0  # a pure-DP claim (StoBatch's Theorem 4)
        object.__setattr__(self, "delta", 0.0 if pure else _check_delta(self.delta))

    def describe(self) -> str:
        """``"nominal epsilon 3.24e+05 at delta 1e-05 (source)"``."""
        return f"nominal epsilon {self.epsilon:.4g} at delta {self.delta:g} ({self.source})"


@dataclass(frozen=True)
class LaplaceEvent:
    """A pure ``epsilon``-DP release (``delta = 0``) by a Laplace mechanism, named by ``source``.

    Pure events compose with the Gaussian history by basic composition: :meth:`PrivacyLedger.epsilon` adds their
    epsilons to the Gaussian part's epsilon at the run's delta (Dwork and Roth 2014, Theorem 3.16), a valid upper
    bound whatever the order of the releases. One source is one release of one noise draw: the guarantee of noise
    drawn once and reused (StoBatch, Phan et al. 2020) does not grow with the number of steps, so recording the same
    source again changes nothing.
    """

    source: str
    epsilon: float

    def __post_init__(self) -> None:
        if not isinstance(self.source, str) or not self.source:
            raise ValueError(f"source={self.source!r} must be a non-empty name of the Laplace release")
        if not (math.isfinite(float(self.epsilon)) and float(self.epsilon) > 0):
            raise ValueError(
                f"epsilon={self.epsilon!r} of the Laplace release {self.source!r} must be a finite number > 0"
            )
        object.__setattr__(self, "epsilon", float(self.epsilon))


def _is_count(value: Any, minimum: int) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool) and value >= minimum


def _as_event(item: PrivacyEvent | Sequence[Any]) -> PrivacyEvent:
    if isinstance(item, PrivacyEvent):
        return item
    if isinstance(item, (tuple, list)) and len(item) == 3:
        return PrivacyEvent(*item)
    raise ValueError(f"history entry {item!r} must be a PrivacyEvent or a (noise_multiplier, sample_rate, steps)")


def _check_delta(delta: float) -> float:
    if not 0 < delta < 1:
        raise ValueError(f"delta={delta!r} must lie in (0, 1); a common choice is default_delta(num_examples)")
    return float(delta)


def _check_accountant(accountant: str) -> None:
    if accountant not in ACCOUNTANTS:
        raise ValueError(
            f"accountant={accountant!r} is unknown; choose one of {ACCOUNTANTS} ('gdp' is an approximation only)"
        )


class ApproximateAccountingWarning(UserWarning):
    """An epsilon was computed by an approximation (``"gdp"``) that can under-report the true epsilon."""


def check_guaranteed_accountant(accountant: str, purpose: str) -> None:
    """Raise ``ValueError`` unless ``accountant`` gives proven upper bounds (pld, prv, rdp) and can serve ``purpose``.

    A target or a budget checked with an approximate accountant could be exceeded by the true epsilon.
    """
    _check_accountant(accountant)
    if accountant not in GUARANTEED_ACCOUNTANTS:
        raise ValueError(
            f"accountant={accountant!r} is a central-limit approximation that can under-report epsilon, so it cannot "
            f"be used for {purpose}; use one of {GUARANTEED_ACCOUNTANTS} (pld is the tightest guarantee)"
        )


# --------------------------------------------------------------------------------------------------------------- RDP


def _log_a_integer(q: float, sigma: float, alpha: int) -> float:
    """``log A_alpha`` for integer ``alpha``: binomial expansion of ``E_{z~mu0}[(mu(z)/mu0(z))^alpha]`` (MTZ19 §3.2)."""
    k = np.arange(alpha + 1, dtype=np.float64)
    log_binom = special.gammaln(alpha + 1) - special.gammaln(k + 1) - special.gammaln(alpha - k + 1)
    log_terms = log_binom + k * math.log(q) + (alpha - k) * math.log1p(-q) + k * (k - 1) / (2 * sigma**2)
    return float(special.logsumexp(log_terms))


def _log_a_fractional(q: float, sigma: float, alpha: float) -> float:
    """``log A_alpha`` for fractional ``alpha`` (MTZ19 §3.3).

    The integral is split at ``z0``, where ``(1 - q) mu0 = q mu1``. Below ``z0`` the integrand is expanded as a
    generalized binomial series in ``q mu1 / ((1 - q) mu0)``, above it in ``(1 - q) mu0 / (q mu1)``; each term is a
    Gaussian moment times a Gaussian tail probability. Terms are summed with signs in log space and the series is
    extended until its last terms fall below ``exp(-30)`` (past ``alpha`` the series alternates, so the truncation
    error is below the first dropped term).
    """
    z0 = sigma**2 * (math.log1p(-q) - math.log(q)) + 0.5
    num_terms = 64
    while True:
        i = np.arange(num_terms, dtype=np.float64)
        j = alpha - i
        coef = special.binom(alpha, i)
        log_coef = np.log(np.abs(coef))
        below = log_coef + i * math.log(q) + j * math.log1p(-q) + i * (i - 1) / (2 * sigma**2)
        below += special.log_ndtr((z0 - i) / sigma)
        above = log_coef + j * math.log(q) + i * math.log1p(-q) + j * (j - 1) / (2 * sigma**2)
        above += special.log_ndtr((j - z0) / sigma)
        if max(below[-1], above[-1]) < _LOG_TERM_CUTOFF and num_terms > alpha + 1:
            break
        if num_terms >= _MAX_SERIES_TERMS:
            return math.inf  # not converged: give up on this order rather than under-report it
        num_terms *= 4
    signs = np.sign(coef)
    log_a, sign = special.logsumexp(np.concatenate([below, above]), b=np.concatenate([signs, signs]), return_sign=True)
    return float(log_a) if sign > 0 else math.inf


def compute_rdp(
    sample_rate: float, noise_multiplier: float, steps: int, orders: Sequence[float] = DEFAULT_RDP_ORDERS
) -> np.ndarray:
    """Renyi DP of ``steps`` compositions of the Poisson-subsampled Gaussian mechanism.

    Implements Mironov, Talwar, Zhang 2019 (https://arxiv.org/abs/1908.10530): for order ``alpha`` one step is
    ``(alpha, log(A_alpha) / (alpha - 1))``-RDP with ``A_alpha = E_{z~N(0, s^2)}[((1 - q) + q exp((2z - 1) / (2 s^2)))
    ^alpha]``, exact for integer orders and by a convergent series for fractional ones; RDP composes additively.

    Args:
        sample_rate: Poisson sampling probability ``q`` in (0, 1].
        noise_multiplier: noise std divided by the L2 sensitivity, > 0.
        steps: number of compositions, >= 0.
        orders: Renyi orders, each > 1.

    Returns:
        The RDP value at every order (float64 array, >= 0, the same length as ``orders``).
    """
    event = PrivacyEvent(noise_multiplier, sample_rate, steps)
    alphas = np.asarray(orders, dtype=np.float64)
    if alphas.ndim != 1 or not np.all(alphas > 1) or not np.all(np.isfinite(alphas)):
        raise ValueError(f"orders must be a 1-D sequence of finite Renyi orders > 1, got {orders!r}")
    q, sigma = event.sample_rate, event.noise_multiplier
    if event.steps == 0:
        return np.zeros_like(alphas)
    if q == 1.0:
        return event.steps * alphas / (2 * sigma**2)
    log_a = [
        _log_a_integer(q, sigma, int(a)) if float(a).is_integer() else _log_a_fractional(q, sigma, float(a))
        for a in alphas
    ]
    return np.maximum(event.steps * np.asarray(log_a) / (alphas - 1), 0.0)


def rdp_to_epsilon(orders: Sequence[float], rdp: Sequence[float], delta: float) -> tuple[float, float]:
    """Converts RDP at several orders to ``(epsilon, delta)``-DP, taking the best order.

    Uses Balle, Barthe, Gaboardi, Hsu, Sato 2020, Theorem 21 (https://arxiv.org/abs/1905.09982), as Opacus does:
    ``epsilon = rdp - (log(delta) + log(alpha)) / (alpha - 1) + log((alpha - 1) / alpha)``, clipped below at 0.
    When the best order is the smallest or largest given, a wider order grid may give a smaller (still valid) value.

    Returns:
        ``(epsilon, best_order)``; ``(inf, nan)`` when every order is infinite or undefined.
    """
    alphas, values = np.asarray(orders, dtype=np.float64), np.asarray(rdp, dtype=np.float64)
    if alphas.shape != values.shape or alphas.ndim != 1 or alphas.size == 0:
        raise ValueError(f"orders and rdp must be 1-D and of equal length, got {alphas.shape} and {values.shape}")
    if not np.all(alphas > 1):
        raise ValueError("every Renyi order must be > 1")
    delta = _check_delta(delta)
    with np.errstate(invalid="ignore"):
        eps = values - (math.log(delta) + np.log(alphas)) / (alphas - 1) + np.log((alphas - 1) / alphas)
    if not np.any(np.isfinite(eps)):
        return math.inf, math.nan
    best = int(np.nanargmin(eps))
    return max(0.0, float(eps[best])), float(alphas[best])


def _rdp_epsilon(events: Sequence[PrivacyEvent], delta: float) -> float:
    rdp = sum(compute_rdp(e.sample_rate, e.noise_multiplier, e.steps) for e in events)
    return rdp_to_epsilon(DEFAULT_RDP_ORDERS, rdp, delta)[0]


# ------------------------------------------------------------------------------------------------------ PLD, PRV, GDP


PLD_EPSILON_CAP = 50.0
"""Above this RDP epsilon the ``"pld"`` accountant reports the RDP bound: PLD's grid of privacy losses grows like
``1 / (noise_multiplier^2 * interval)`` and would need gigabytes, while tightness no longer matters."""
PLD_MAX_STEPS = 10**6
"""Beyond this many steps the ``"pld"`` accountant reports the RDP bound: one composition takes seconds at a million
steps and minutes at a hundred million (a budget search can ask for those)."""


def _pld_epsilon(events: Sequence[PrivacyEvent], delta: float) -> float:
    from lightning_dprobust.core.pld import pld_epsilon

    rdp = _rdp_epsilon(events, delta)
    if rdp > PLD_EPSILON_CAP or sum(e.steps for e in events) > PLD_MAX_STEPS:
        return rdp
    return pld_epsilon(events, delta)


def _prv_epsilon(events: Sequence[PrivacyEvent], delta: float) -> float:
    from opacus.accountants import PRVAccountant

    accountant = PRVAccountant()
    accountant.history = [(e.noise_multiplier, e.sample_rate, e.steps) for e in events]
    try:
        with warnings.catch_warnings(), np.errstate(divide="ignore"):
            # Opacus sizes the PRV domain with its own RDP bound, which warns about its order grid.
            warnings.filterwarnings("ignore", message="Optimal order is the", category=UserWarning)
            return float(accountant.get_epsilon(delta))
    except (RuntimeError, ValueError) as error:
        raise RuntimeError(
            f"the PRV accountant failed on history {accountant.history} at delta={delta:g} ({error}); "
            "use accountant='rdp', which always returns a valid upper bound"
        ) from error


def gdp_mu_to_epsilon(mu: float, delta: float) -> float:
    """Smallest ``epsilon`` such that ``mu``-GDP implies ``(epsilon, delta)``-DP (Dong, Roth, Su 2019, Cor. 2.13).

    Solves ``delta = Phi(-eps/mu + mu/2) - exp(eps) Phi(-eps/mu - mu/2)`` (https://arxiv.org/abs/1905.02383) by
    Brent's method; the right side is decreasing in ``eps``. Exact for ``mu``-GDP mechanisms.
    """
    delta = _check_delta(delta)
    if not mu >= 0:
        raise ValueError(f"mu={mu!r} must be >= 0")
    if mu == 0:
        return 0.0
    if not math.isfinite(mu):
        return math.inf

    def excess(eps: float) -> float:
        tight = math.exp(special.log_ndtr(-eps / mu + mu / 2)) - math.exp(eps + special.log_ndtr(-eps / mu - mu / 2))
        return tight - delta

    if excess(0.0) <= 0:
        return 0.0
    upper = 1.0
    while excess(upper) > 0:
        upper *= 2
    return float(optimize.brentq(excess, upper / 2 if upper > 1 else 0.0, upper, xtol=1e-12, rtol=1e-12))


def gdp_epsilon(history: Iterable[PrivacyEvent | Sequence[Any]], delta: float) -> float:
    """APPROXIMATE epsilon of DP-SGD by the central limit theorem for Poisson subsampling (Bu, Dong, Long, Su 2019).

    ``T`` steps of rate ``q`` and noise ``sigma`` are approximately ``mu``-GDP with
    ``mu = q sqrt(T (exp(1 / sigma^2) - 1))`` (https://arxiv.org/abs/1911.11607, Theorem 1, as Opacus' GDP
    accountant). Asymptotic: it can underestimate epsilon for few steps or large ``q``; it is no guarantee, and
    every call warns with :class:`ApproximateAccountingWarning`.

    Raises:
        ValueError: when the history mixes several ``(noise_multiplier, sample_rate)`` pairs.
    """
    events = PrivacyLedger(history).history
    pairs = {(e.noise_multiplier, e.sample_rate) for e in events}
    if len(pairs) > 1:
        raise ValueError(
            f"the 'gdp' accountant needs one constant (noise_multiplier, sample_rate), got {sorted(pairs)}; "
            "use accountant='rdp' or 'prv' for a varying schedule"
        )
    if not events:
        return 0.0
    warnings.warn(
        "accountant='gdp' is a central-limit APPROXIMATION that can under-report epsilon; it is no guarantee: "
        "report epsilon with 'pld', 'prv' or 'rdp'",
        ApproximateAccountingWarning,
        stacklevel=2,
    )
    sigma, q = events[0].noise_multiplier, events[0].sample_rate
    with np.errstate(over="ignore"):
        mu = q * math.sqrt(sum(e.steps for e in events) * float(np.expm1(np.float64(sigma) ** -2)))
    return gdp_mu_to_epsilon(mu, delta)


_EPSILON_FUNCTIONS: dict[str, Callable[[Sequence[PrivacyEvent], float], float]] = {
    "pld": _pld_epsilon,
    "rdp": _rdp_epsilon,
    "prv": _prv_epsilon,
    "gdp": gdp_epsilon,
}


def epsilon_for(
    history: Iterable[PrivacyEvent | Sequence[Any]], delta: float, accountant: str = DEFAULT_ACCOUNTANT
) -> float:
    """Epsilon spent by a history of ``(noise_multiplier, sample_rate, steps)`` events at ``delta``.

    Returns 0.0 for a history without steps. See the module docstring for what each accountant guarantees.
    """
    _check_accountant(accountant)
    delta = _check_delta(delta)
    events = PrivacyLedger(history).history
    if not events:
        return 0.0
    return _EPSILON_FUNCTIONS[accountant](events, delta)


def default_delta(num_examples: int) -> float:
    """``1 / (10 n)`` rounded down to a power of ten (``1293 -> 1e-5``, ``60000 -> 1e-6``), so ``delta << 1/n``."""
    if not _is_count(num_examples, minimum=1):
        raise ValueError(f"num_examples={num_examples!r} must be a positive int (the training set size)")
    exponent = len(str(10 * int(num_examples) - 1))
    return float(f"1e-{exponent}")


@runtime_checkable
class LedgerOwner(Protocol):
    """Whatever owns a run's privacy ledger: ``DPCallback`` (and ``TransDenoiserCallback``), or a LightningModule with
    its own mechanism (StoBatch, residual perturbation, the generative modules). Reports, logs and zoo records find the
    ledger through this protocol, with the delta and accountant it is read at."""

    ledger: PrivacyLedger

    @property
    def privacy_delta(self) -> float | None: ...

    @property
    def privacy_accountant(self) -> str: ...


class DeltaAndAccountant:
    """:class:`LedgerOwner`'s ``privacy_delta`` and ``privacy_accountant`` read from an owner's ``delta`` and
    ``accountant`` attributes (``DPCallback`` and the generative modules)."""

    delta: float | None
    accountant: str

    @property
    def privacy_delta(self) -> float | None:
        """The delta at which reports read the owner's ledger."""
        return self.delta

    @property
    def privacy_accountant(self) -> str:
        """The accountant with which reports read the owner's ledger."""
        return self.accountant


class PrivacyLedger:
    """Composes privacy events: a history of ``(noise_multiplier, sample_rate, steps)``.

    Consecutive events with the same ``(noise_multiplier, sample_rate)`` are merged and events without steps are
    dropped, so the history stays short over a long run. Nominal claims (:class:`NominalEvent`, via
    :meth:`record_nominal`) are kept apart and never composed: the data they cover was used without a DP guarantee,
    so a ledger holding one reports :meth:`epsilon` ``inf`` and describes itself with :meth:`nominal_summary`.
    Pure-DP Laplace releases (:class:`LaplaceEvent`, via :meth:`record_laplace`) are added to the Gaussian epsilon.
    ``state_dict`` holds plain lists, strings, floats and ints only (loadable with ``torch.load(weights_only=True)``);
    a ledger restored from it reports the same epsilon, the same nominal claims and the same Laplace releases.
    """

    def __init__(self, history: Iterable[PrivacyEvent | Sequence[Any]] = ()) -> None:
        self._events: list[PrivacyEvent] = []
        self._nominal: dict[str, NominalEvent] = {}
        self._laplace: dict[str, LaplaceEvent] = {}
        for item in history:
            event = _as_event(item)
            self.record(event.noise_multiplier, event.sample_rate, event.steps)

    def record(self, noise_multiplier: float, sample_rate: float, steps: int = 1) -> None:
        """Adds ``steps`` steps of ``(noise_multiplier, sample_rate)``; raises ``ValueError`` on invalid values."""
        event = PrivacyEvent(noise_multiplier, sample_rate, steps)
        if event.steps == 0:
            return
        last = self._events[-1] if self._events else None
        if last and (last.noise_multiplier, last.sample_rate) == (event.noise_multiplier, event.sample_rate):
            self._events[-1] = PrivacyEvent(last.noise_multiplier, last.sample_rate, last.steps + event.steps)
        else:
            self._events.append(event)

    def record_nominal(self, source: str, epsilon: float, delta: float) -> None:
        """Records (or updates) the nominal claim of ``source``; from then on :meth:`epsilon` is ``inf``."""
        event = NominalEvent(source, epsilon, delta)
        self._nominal[event.source] = event

    def record_laplace(self, source: str, epsilon: float) -> None:
        """Records the pure ``epsilon``-DP release ``source`` (see :class:`LaplaceEvent`).

        Recording ``source`` again with the same epsilon is the same release and changes nothing.

        Raises:
            ValueError: ``source`` was recorded with another epsilon (a second release under one name would
                otherwise be lost), or the values are invalid.
        """
        event = LaplaceEvent(source, epsilon)
        known = self._laplace.get(event.source)
        if known is not None and known.epsilon != event.epsilon:
            raise ValueError(
                f"the Laplace release {source!r} is already recorded with epsilon {known.epsilon:g}, not "
                f"{event.epsilon:g}: give a new release its own source name"
            )
        self._laplace[event.source] = event

    @property
    def laplace(self) -> tuple[LaplaceEvent, ...]:
        """The pure-DP releases, one per source, in recording order."""
        return tuple(self._laplace.values())

    @property
    def pure_epsilon(self) -> float:
        """The sum of the pure-DP releases' epsilons (basic composition)."""
        return float(sum(event.epsilon for event in self._laplace.values()))

    @property
    def nominal(self) -> tuple[NominalEvent, ...]:
        """The nominal claims, one per source: reported as nominal, never as a DP guarantee."""
        return tuple(self._nominal.values())

    @property
    def history(self) -> tuple[PrivacyEvent, ...]:
        """The merged events, oldest first."""
        return tuple(self._events)

    @property
    def steps(self) -> int:
        """Total number of recorded steps."""
        return sum(e.steps for e in self._events)

    def epsilon(self, delta: float, accountant: str = DEFAULT_ACCOUNTANT) -> float:
        """The DP epsilon spent so far at ``delta``: the Gaussian history's epsilon by :func:`epsilon_for` plus
        :attr:`pure_epsilon` (basic composition); 0.0 for an empty ledger; ``inf`` once a nominal claim is recorded
        (that part of the run has no DP guarantee, whatever its nominal value). Without Gaussian events the guarantee
        is pure DP and ``delta`` may be 0."""
        if self._nominal:
            return math.inf
        if not self._events:
            _check_accountant(accountant)
            if not 0 <= delta < 1:
                raise ValueError(f"delta={delta!r} must lie in [0, 1) for a ledger of pure-DP releases")
            return self.pure_epsilon
        return epsilon_for(self._events, delta, accountant) + self.pure_epsilon

    def nominal_summary(self) -> str | None:
        """``"no DP guarantee; nominal epsilon X at delta D (source)"`` (one clause per claim); ``None`` without
        nominal claims. The way to report a ledger whose :meth:`epsilon` is ``inf`` because of them."""
        if not self._nominal:
            return None
        return "no DP guarantee; " + "; ".join(claim.describe() for claim in self._nominal.values())

    def state_dict(self) -> dict[str, list[list[Any]]]:
        """``{"history": [[noise_multiplier, sample_rate, steps], ...]}``, plus ``"nominal": [[source, epsilon,
        delta], ...]`` when a nominal claim was recorded and ``"laplace": [[source, epsilon], ...]`` when a pure-DP
        release was."""
        state: dict[str, list[list[Any]]] = {
            "history": [[e.noise_multiplier, e.sample_rate, e.steps] for e in self._events]
        }
        if self._nominal:
            state["nominal"] = [[e.source, e.epsilon, e.delta] for e in self._nominal.values()]
        if self._laplace:
            state["laplace"] = [[e.source, e.epsilon] for e in self._laplace.values()]
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Replaces the history with the one in ``state``; the ledger is unchanged if ``state`` is invalid."""
        if not isinstance(state, dict) or "history" not in state:
            raise ValueError(f"a PrivacyLedger state must be a dict with a 'history' key, got {state!r}")
        restored = PrivacyLedger(state["history"])
        for item in state.get("nominal", []):
            restored.record_nominal(*item)
        for item in state.get("laplace", []):
            restored.record_laplace(*item)
        self._events, self._nominal, self._laplace = restored._events, restored._nominal, restored._laplace

    def __repr__(self) -> str:
        nominal = f", nominal={list(self._nominal.values())!r}" if self._nominal else ""
        laplace = f", laplace={list(self._laplace.values())!r}" if self._laplace else ""
        return f"PrivacyLedger(history={list(self._events)!r}{nominal}{laplace})"
