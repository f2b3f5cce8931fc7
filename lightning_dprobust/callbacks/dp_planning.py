"""Planning of ``DPCallback``: steps of a run, noise for a target epsilon, steps within a budget, delta checks.

Every plan is made against the ledger of steps already taken (a resumed run counts the checkpoint's steps), so a
target epsilon or a budget is never exceeded by the composition of the old and the new steps.
"""

from __future__ import annotations

import math

import lightning as L
from lightning.pytorch.utilities.exceptions import MisconfigurationException

from lightning_dprobust.core.accounting import PrivacyLedger, default_delta
from lightning_dprobust.core.calibration import calibrate_noise_multiplier, max_steps_within_budget

MAX_DEFAULT_DELTA = 1e-3
"""The largest delta ``DPCallback`` picks by itself; a smaller training set needs an explicit, justified delta."""


def planned_steps(trainer: L.Trainer, steps_per_epoch: int) -> int:
    """Total optimizer steps the trainer will take: ``max_steps`` or ``max_epochs`` times the batches per epoch.

    The batches per epoch are the trainer's (``limit_train_batches`` applied) once its train loader is set up.
    """
    per_epoch = trainer.num_training_batches
    per_epoch = steps_per_epoch if not isinstance(per_epoch, int) or per_epoch < 1 else per_epoch
    candidates = []
    if trainer.max_steps is not None and trainer.max_steps > 0:
        candidates.append(trainer.max_steps)
    if trainer.max_epochs is not None and trainer.max_epochs > 0:
        candidates.append(trainer.max_epochs * per_epoch)
    if not candidates:
        raise MisconfigurationException(
            "DPCallback(target_epsilon=...) needs a finite training length to calibrate the noise: "
            "set Trainer(max_epochs=...) or Trainer(max_steps=...)"
        )
    return min(candidates)


def calibrate(
    target_epsilon: float,
    delta: float,
    sample_rate: float,
    total_steps: int,
    ledger: PrivacyLedger,
    accountant: str,
    current: float | None = None,
) -> float:
    """Noise multiplier such that the ledger's steps followed by the remaining steps spend at most the target.

    ``current`` (a resumed checkpoint's noise multiplier) is kept when the whole plan stays within the target with
    it, so that a resumed run continues the uninterrupted one; otherwise the remaining steps are recalibrated.

    Raises:
        MisconfigurationException: when the ledger already spent the target, or the remaining steps cannot fit.
    """
    spent = ledger.epsilon(delta, accountant)
    if spent >= target_epsilon:
        raise MisconfigurationException(
            f"DPCallback(target_epsilon={target_epsilon}): the checkpoint's {ledger.steps} steps already spent "
            f"epsilon {spent:.4g}; no further step fits the target. Keep the checkpoint as it is, or train a new run"
        )
    remaining = total_steps - ledger.steps
    if current is not None and current > 0 and remaining > 0:
        plan = PrivacyLedger([*ledger.history, (current, sample_rate, remaining)])
        if plan.epsilon(delta, accountant) <= target_epsilon:
            return current
    try:
        return calibrate_noise_multiplier(
            target_epsilon, delta, sample_rate, remaining, accountant=accountant, history=ledger.history
        )
    except ValueError as error:
        raise MisconfigurationException(
            f"DPCallback(target_epsilon={target_epsilon}) cannot be reached with {remaining} more steps after "
            f"{ledger.steps} recorded ones at sample_rate={sample_rate:.4g}, delta={delta:g}: {error}. Raise "
            "target_epsilon, or lower max_epochs / the batch size"
        ) from error


def steps_within_budget(
    epsilon_budget: float,
    delta: float,
    noise_multiplier: float,
    sample_rate: float,
    ledger: PrivacyLedger,
    accountant: str,
) -> int:
    """Total ledger steps (recorded plus new) that stay within ``epsilon_budget``."""
    extra = max_steps_within_budget(
        epsilon_budget, delta, noise_multiplier, sample_rate, accountant=accountant, history=ledger.history
    )
    if extra == 0 and ledger.steps == 0:
        raise MisconfigurationException(
            f"DPCallback(epsilon_budget={epsilon_budget}) is smaller than the epsilon of a single step "
            f"(noise_multiplier={noise_multiplier:.4g}): raise epsilon_budget or the noise"
        )
    return ledger.steps + extra


def resolve_delta(delta: float | None, num_examples: int, owner: str = "DPCallback") -> float:
    """The given delta (checked ``< 1/n``) or the default ``1/(10 n)``, which must not exceed ``MAX_DEFAULT_DELTA``.

    ``owner`` names the class whose ``delta`` argument it is (``DPCallback``, or a method that does its own DP) in the
    error messages.
    """
    if delta is None:
        delta = default_delta(num_examples)
        if delta > MAX_DEFAULT_DELTA:
            raise MisconfigurationException(
                f"{owner}: the training set has only {num_examples} examples, so the default delta 1/(10 n) "
                f"rounded down is {delta:g} > {MAX_DEFAULT_DELTA:g}: a guarantee that fails with such a probability "
                f"is no meaningful guarantee. Train on more examples, or pass {owner}(delta=...) explicitly, "
                "well below 1/n"
            )
    elif not delta < 1.0 / num_examples or not math.isfinite(delta):
        raise MisconfigurationException(
            f"{owner}(delta={delta}) is >= 1/n = {1.0 / num_examples:.3g}: such a delta allows releasing a whole "
            "example; use delta well below 1/n (default: 1/(10 n) rounded down)"
        )
    return delta
