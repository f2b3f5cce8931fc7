"""AIN's bound schedule: progressive bound decay (Eqs 5.7-5.9) and the adaptive controller of Algorithm 2.

Tang, "Deep Learning with Differential Privacy and Adversarial Robustness", PhD thesis, Emory University 2021,
section 5.2.3 (AIN, TDSC 2021). Pure Python: no torch, no lightning.

The thesis writes the controller's rate updates as ``d = (1 + gamma1) d`` "to slow down" and ``d = (1 - gamma2) d``
"to speed up", which has the wrong sign for exponential decay (``d < 0``) and time decay. This module implements the
stated *semantics* with gamma1 and gamma2 as magnitude factors on the decay's strength: a rollback multiplies the
strength by ``1 - gamma1`` (slower), a small change by ``1 + gamma2`` (faster). The strength is ``|d|`` for
exponential and time decay and ``-ln d`` for step decay (so ``d`` becomes ``d ** (1 - gamma1)``). With
``gamma1 = gamma2 = 0.4`` this is the authors' code (rate times 0.6 on rollback, 1.4 on speed-up).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Literal

DecayKind = Literal["step", "exp", "time"]
DECAYS: tuple[str, ...] = ("step", "exp", "time")


def check_decay(kind: str, rate: float, step_size: int = 1) -> None:
    """Refuse a decay kind or rate that would not shrink the bound, with a one-line fix.

    Raises:
        ValueError: unknown ``kind``; step decay without ``0 < d < 1`` or ``step_size >= 1``; exp without ``d < 0``;
            time without ``d > 0``.
    """
    if kind not in DECAYS:
        raise ValueError(f"bound decay {kind!r} is unknown: choose one of {DECAYS}")
    valid = {"step": 0 < rate < 1, "exp": rate < 0, "time": rate > 0}[kind]
    need = {"step": "0 < d < 1", "exp": "d < 0", "time": "d > 0"}[kind]
    if not (math.isfinite(rate) and valid):
        raise ValueError(f"{kind} bound decay needs {need}, got d={rate}: e.g. exp with d=-0.02 (the thesis default)")
    if kind == "step" and step_size < 1:
        raise ValueError(f"step bound decay needs step_size >= 1, got {step_size}")


def decayed_bound(kind: DecayKind, initial: float, rate: float, epoch: int, step_size: int = 1) -> float:
    """The closed forms: step ``B0 d^floor(i/v)`` (Eq 5.7), exp ``B0 e^(d i)`` (Eq 5.8), time ``B0/(1+d i)`` (5.9)."""
    check_decay(kind, rate, step_size)
    if kind == "step":
        return initial * rate ** (epoch // step_size)
    if kind == "exp":
        return initial * math.exp(rate * epoch)
    return initial / (1.0 + rate * epoch)


def decay_once(kind: DecayKind, bound: float, rate: float, epoch: int, step_size: int = 1) -> float:
    """The iterative form ``f_decay``: the bound of epoch ``epoch`` (>= 1) from that of epoch ``epoch - 1``.

    step: ``B d`` when ``epoch`` is a multiple of ``step_size``, else ``B``; exp: ``B e^d``; time:
    ``B (1 + d (epoch - 1)) / (1 + d epoch)``. With a constant ``d``, applying it for epochs ``1..i`` gives
    :func:`decayed_bound` at ``i``.
    """
    check_decay(kind, rate, step_size)
    if epoch < 1:
        raise ValueError(f"decay_once gives the bound of epoch >= 1, got epoch={epoch}")
    if kind == "step":
        return bound * rate if epoch % step_size == 0 else bound
    if kind == "exp":
        return bound * math.exp(rate)
    return bound * (1.0 + rate * (epoch - 1)) / (1.0 + rate * epoch)


def scale_strength(kind: DecayKind, rate: float, factor: float) -> float:
    """The rate whose decay strength is ``factor`` times that of ``rate`` (``factor < 1``: slower decay)."""
    if kind == "step":
        return rate**factor
    return rate * factor


@dataclass
class Decision:
    """What the controller did after one validation: ``action`` is ``"rollback"``, ``"decay"`` or ``"speedup"``
    (a decay after speeding up); ``change`` is ``r = (S0 - S1) / S1``."""

    action: str
    change: float
    bound: float
    rate: float


@dataclass
class BoundController:
    """Algorithm 2's adaptive bound decay as a small state machine (one :meth:`update` per epoch).

    After an epoch trained at bound ``B`` with validation attack success ``S1``: ``r = (S0 - S1) / S1`` (``S0``
    starts at 1.0). If ``r > t_up`` the epoch is rolled back: the caller restores the previous epoch's weights, the
    bound stays, and the decay slows down. Otherwise, if ``r < t_low`` the decay speeds up; then ``B`` decays by one
    epoch and ``S0 = S1``. ``adaptive=False`` always decays with the fixed rate. The bound never goes below
    ``min_bound`` (0: no floor). ``S1 = 0`` counts as an infinite drop (``r = inf``) unless ``S0 = 0`` too.

    Attributes:
        bound: the current bound ``B``. rate: the current decay rate ``d``. previous_success: ``S0``.
        epoch: the number of decays applied (the ``i`` of the decay's iterative form).
    """

    bound: float
    rate: float
    kind: DecayKind = "exp"
    t_up: float = 1e-4
    t_low: float = 1e-5
    gamma1: float = 0.5
    gamma2: float = 0.5
    step_size: int = 1
    min_bound: float = 0.0
    adaptive: bool = True
    previous_success: float = 1.0
    epoch: int = 0

    def __post_init__(self) -> None:
        check_decay(self.kind, self.rate, self.step_size)
        if not (0 < self.t_low < self.t_up < 1):
            raise ValueError(f"thresholds need 0 < t_low < t_up < 1, got t_low={self.t_low}, t_up={self.t_up}")
        if not (0 <= self.gamma1 < 1 and self.gamma2 >= 0):
            raise ValueError(f"need 0 <= gamma1 < 1 and gamma2 >= 0, got gamma1={self.gamma1}, gamma2={self.gamma2}")
        if not (self.bound > 0 and 0 <= self.min_bound <= self.bound):
            raise ValueError(f"need bound > 0 and 0 <= min_bound <= bound, got {self.bound}, {self.min_bound}")

    def update(self, success: float) -> Decision:
        """Apply lines 5-16 of Algorithm 2 for the validation success rate ``success`` (``S1`` in ``[0, 1]``)."""
        if not 0 <= success <= 1:
            raise ValueError(f"the validation success rate must lie in [0, 1], got {success}")
        change = _relative_drop(self.previous_success, success)
        action = "decay"
        if self.adaptive and change > self.t_up:
            self.rate = scale_strength(self.kind, self.rate, 1.0 - self.gamma1)
            return Decision("rollback", change, self.bound, self.rate)
        if self.adaptive and change < self.t_low:
            self.rate = scale_strength(self.kind, self.rate, 1.0 + self.gamma2)
            self.rate = min(self.rate, 1.0 - 1e-12) if self.kind == "step" else self.rate
            action = "speedup"
        self.epoch += 1
        self.bound = max(decay_once(self.kind, self.bound, self.rate, self.epoch, self.step_size), self.min_bound)
        self.previous_success = success
        return Decision(action, change, self.bound, self.rate)

    def state_dict(self) -> dict[str, float | int | str | bool]:
        return asdict(self)

    def load_state_dict(self, state: dict[str, float | int | str | bool]) -> None:
        for key, value in state.items():
            setattr(self, key, value)


def _relative_drop(previous: float, current: float) -> float:
    if current > 0:
        return (previous - current) / current
    return math.inf if previous > 0 else 0.0


__all__ = ["DECAYS", "BoundController", "Decision", "check_decay", "decay_once", "decayed_bound", "scale_strength"]
