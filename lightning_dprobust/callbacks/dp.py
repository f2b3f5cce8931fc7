"""``DPCallback``: the whole DP-SGD guarantee (sampling, clipping, noise, accounting) in one Lightning callback."""

from __future__ import annotations

import enum
import math
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from torch import Tensor

from lightning_dprobust.callbacks.dp_checks import (
    check_module,
    check_trainer,
    guard_single_optimizer,
    release_optimizer_guard,
)
from lightning_dprobust.callbacks.dp_loader import PoissonLoaderFactory
from lightning_dprobust.core.accounting import (
    ACCOUNTANTS,
    DEFAULT_ACCOUNTANT,
    PrivacyLedger,
    default_delta,
)
from lightning_dprobust.core.calibration import calibrate_noise_multiplier, max_steps_within_budget
from lightning_dprobust.core.per_sample import CLIPPING_RULES, PerExampleClipper, gaussian_noise_like


class StopReason(enum.Enum):
    """Why ``DPCallback`` stopped training."""

    BUDGET_EXHAUSTED = "privacy budget exhausted"


class DPCallback(Callback):
    """Trains any :class:`~lightning_dprobust.methods.base.ClassifierModule` with DP-SGD (Abadi et al. 2016).

    At every optimizer step:

    1. the batch is a Poisson sample: each training example is included independently with probability
       ``sample_rate`` (the callback builds the train loader from the data module's dataset);
    2. each example's gradient (the mean over its views, for augmentation groups) is clipped to L2 norm
       ``max_grad_norm``;
    3. the clipped gradients are summed and ``N(0, (noise_multiplier * max_grad_norm)^2 I)`` is added once
       (on rank 0 under DDP; the other ranks' sums are all-reduced into it);
    4. the result is divided by the expected batch size ``sample_rate * len(train_set)`` and handed to the
       optimizer (SGD, Adam, ...: post-processing);
    5. the step is recorded in a privacy ledger; ``privacy/epsilon`` is logged at each epoch end.

    Guarantees:
        The released parameters satisfy ``(epsilon, delta)``-DP with respect to adding or removing one training
        example, with ``epsilon`` as reported by the chosen accountant (``pld`` default, ``prv``, ``rdp``; ``gdp`` is
        only an approximation, see :mod:`lightning_dprobust.core.accounting`).
        The ledger is part of the checkpoint, so a resumed run reports the epsilon of all steps taken.

    Assumptions (each violation is refused at setup with a message that says how to fix it):
        one optimizer; no gradient accumulation; no fp16 grad scaling; no Lightning gradient clipping; no
        BatchNorm or other layer mixing examples; the train loader built by this callback (Poisson sampling),
        unless ``poisson_sampling=False`` is set, in which case the loader's own shuffled batches are used and
        the reported epsilon is only an approximation. Per-step training metrics are not logged, since they are
        not covered by the guarantee.

    Args:
        max_grad_norm: clipping bound ``C`` on each example's gradient.
        noise_multiplier: ``sigma``; the noise std is ``sigma * C``. Give this or ``target_epsilon``.
        target_epsilon: calibrate ``sigma`` so that the planned steps (``max_epochs`` or ``max_steps``) spend at
            most this epsilon (and within 0.5% of it).
        delta: the delta of the guarantee; default ``1 / (10 n)`` rounded down to a power of ten.
        accountant: ``"pld"`` (tightest guarantee), ``"prv"``, ``"rdp"``, or ``"gdp"`` (an approximation, which
            can neither calibrate ``target_epsilon`` nor bound ``epsilon_budget``).
        epsilon_budget: stop training before a step would spend more than this epsilon.
        sample_rate: Poisson inclusion probability; default ``batch_size * world_size / n``.
        poisson_sampling: ``False`` keeps the data module's loader (approximate accounting; logged loudly).
        max_physical_batch_size: examples per vectorized per-example-gradient chunk; default: as many as fit in
            256 MB of per-example gradients (see :class:`~lightning_dprobust.core.per_sample.PerExampleClipper`).
        clipping: ``"flat"`` (``min(1, C/||g||)``), ``"psac"`` or ``"automatic"``; each bounds every example's
            contribution by ``C`` (see :func:`lightning_dprobust.core.per_sample.clip_factors`).
        seed: seed of the Poisson sampler.

    Example:
        >>> from lightning_dprobust.callbacks import DPCallback
        >>> callback = DPCallback(max_grad_norm=1.0, target_epsilon=3.0)
    """

    def __init__(
        self,
        max_grad_norm: float = 1.0,
        noise_multiplier: float | None = None,
        target_epsilon: float | None = None,
        delta: float | None = None,
        accountant: str = DEFAULT_ACCOUNTANT,
        epsilon_budget: float | None = None,
        sample_rate: float | None = None,
        poisson_sampling: bool = True,
        max_physical_batch_size: int | None = None,
        clipping: str = "flat",
        seed: int = 0,
    ) -> None:
        _validate_arguments(
            max_grad_norm, noise_multiplier, target_epsilon, delta, accountant, epsilon_budget, sample_rate
        )
        if clipping not in CLIPPING_RULES:
            raise MisconfigurationException(f"DPCallback(clipping={clipping!r}) must be one of {CLIPPING_RULES}")
        self.clipping = clipping
        self.max_grad_norm = float(max_grad_norm)
        self.noise_multiplier = noise_multiplier
        self.target_epsilon = target_epsilon
        self.delta = delta
        self.accountant = accountant
        self.epsilon_budget = epsilon_budget
        self.poisson_sampling = poisson_sampling
        self.max_physical_batch_size = max_physical_batch_size
        self.loaders = PoissonLoaderFactory(sample_rate=sample_rate, seed=seed, poisson=poisson_sampling)
        self.ledger = PrivacyLedger()
        self.stop_reason: StopReason | None = None
        self._budget_steps: int | None = None
        self._clipper: PerExampleClipper | None = None
        self._world_size = 1
        self._rank = 0
        self._zero_noise_steps = 0

    # ----------------------------------------------------------------------------------------------- lifecycle
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        check_module(pl_module)
        check_trainer(trainer, self.poisson_sampling)
        self._world_size, self._rank = trainer.world_size, trainer.global_rank
        self.loaders.attach(trainer, pl_module)
        guard_single_optimizer(pl_module)
        self._clipper = PerExampleClipper(
            pl_module, "per_example_loss", self.max_grad_norm, self.max_physical_batch_size, self.clipping
        )

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.loaders.check_train_loader(trainer.train_dataloader, self._world_size)
        if self.delta is None:
            self.delta = default_delta(self.loaders.num_examples)
        elif self.delta >= 1.0 / self.loaders.num_examples:
            raise MisconfigurationException(
                f"DPCallback(delta={self.delta}) is >= 1/n = {1.0 / self.loaders.num_examples:.3g}: such a delta "
                "allows releasing a whole example; use delta well below 1/n (default: 1/(10 n) rounded down)"
            )
        if self.noise_multiplier is None:
            self.noise_multiplier = self._calibrate(trainer)
        if self.epsilon_budget is not None:
            self._budget_steps = self._steps_within_budget(trainer)
        pl_module.private_step = self.private_step
        rank_zero_info(
            f"DPCallback: noise_multiplier={self.noise_multiplier:.4f}, max_grad_norm={self.max_grad_norm}, "
            f"sample_rate={self.loaders.sample_rate:.5f}, delta={self.delta:g}, accountant={self.accountant}"
        )

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        if self._budget_steps is not None and self.ledger.steps >= self._budget_steps:
            trainer.should_stop = True
            if self.stop_reason is None:
                self.stop_reason = StopReason.BUDGET_EXHAUSTED
                rank_zero_info(
                    f"DPCallback: stopping: {self.stop_reason.value} (epsilon_budget={self.epsilon_budget}, "
                    f"spent {self.epsilon():.4f} after {self.ledger.steps} steps)"
                )

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        pl_module.log("privacy/epsilon", self.epsilon(), sync_dist=False, rank_zero_only=False)

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage == "fit":
            pl_module.private_step = None
            self.loaders.detach()
            release_optimizer_guard(pl_module)

    # ------------------------------------------------------------------------------------------- the DP step
    def private_step(self, inputs: tuple[Tensor, ...]) -> Tensor:
        """Clip, sum, noise and account one batch; returns a surrogate loss whose gradient is the DP gradient.

        The surrogate ``sum_p <p, g_p>`` (with ``g`` detached) lets Lightning's optimizer loop, the DDP gradient
        all-reduce and any optimizer run unchanged while ``p.grad`` receives exactly the private gradient.
        """
        if self._budget_steps is not None and self.ledger.steps >= self._budget_steps:
            raise RuntimeError(
                f"DPCallback: epsilon_budget={self.epsilon_budget} is spent; no further private step is allowed"
            )
        clipped = self._clipper(inputs)
        std = self.noise_multiplier * self.max_grad_norm
        noise = gaussian_noise_like(clipped.grads, std if self._rank == 0 else 0.0)
        scale = self._world_size / (self.loaders.sample_rate * self.loaders.num_examples)
        params = self._clipper.trainable_parameters()
        surrogate = sum((params[name] * ((clipped.grads[name] + noise[name]) * scale)).sum() for name in clipped.grads)
        if self.noise_multiplier > 0:
            self.ledger.record(self.noise_multiplier, self.loaders.sample_rate)
        else:
            self._zero_noise_steps += 1
        return surrogate

    # ------------------------------------------------------------------------------------------- accounting
    def epsilon(self, delta: float | None = None) -> float:
        """Epsilon spent so far at ``delta`` (default: the callback's delta); ``inf`` after any noiseless step."""
        if self._zero_noise_steps:
            return math.inf
        return self.ledger.epsilon(delta or self.delta, self.accountant)

    def _planned_steps(self, trainer: L.Trainer) -> int:
        steps_per_epoch = self.loaders.steps_per_epoch
        candidates = []
        if trainer.max_steps is not None and trainer.max_steps > 0:
            candidates.append(trainer.max_steps)
        if trainer.max_epochs is not None and trainer.max_epochs > 0:
            candidates.append(trainer.max_epochs * steps_per_epoch)
        if not candidates:
            raise MisconfigurationException(
                "DPCallback(target_epsilon=...) needs a finite training length to calibrate the noise: "
                "set Trainer(max_epochs=...) or Trainer(max_steps=...)"
            )
        return min(candidates) - self.ledger.steps

    def _calibrate(self, trainer: L.Trainer) -> float:
        steps = self._planned_steps(trainer)
        try:
            return calibrate_noise_multiplier(
                self.target_epsilon, self.delta, self.loaders.sample_rate, steps, accountant=self.accountant
            )
        except ValueError as error:
            raise MisconfigurationException(
                f"DPCallback(target_epsilon={self.target_epsilon}) cannot be reached with {steps} steps at "
                f"sample_rate={self.loaders.sample_rate:.4g}, delta={self.delta:g}: {error}. Raise target_epsilon, "
                "or lower max_epochs / the batch size"
            ) from error

    def _steps_within_budget(self, trainer: L.Trainer) -> int:
        extra = max_steps_within_budget(
            self.epsilon_budget,
            self.delta,
            self.noise_multiplier,
            self.loaders.sample_rate,
            accountant=self.accountant,
            history=self.ledger.history,
        )
        if extra == 0 and self.ledger.steps == 0:
            raise MisconfigurationException(
                f"DPCallback(epsilon_budget={self.epsilon_budget}) is smaller than the epsilon of a single step "
                f"(noise_multiplier={self.noise_multiplier:.4g}): raise epsilon_budget or the noise"
            )
        return self.ledger.steps + extra

    # ----------------------------------------------------------------------------------------- checkpointing
    def state_dict(self) -> dict[str, Any]:
        return {
            "ledger": self.ledger.state_dict(),
            "zero_noise_steps": self._zero_noise_steps,
            "noise_multiplier": self.noise_multiplier,
            "max_grad_norm": self.max_grad_norm,
            "sample_rate": self.loaders.sample_rate,
            "delta": self.delta,
            "accountant": self.accountant,
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        for key in ("max_grad_norm", "accountant"):
            if state_dict[key] != getattr(self, key):
                raise MisconfigurationException(
                    f"DPCallback: the checkpoint was trained with {key}={state_dict[key]!r} but this run has "
                    f"{key}={getattr(self, key)!r}; resume with the same value so the accounting stays valid"
                )
        self.ledger.load_state_dict(state_dict["ledger"])
        self._zero_noise_steps = state_dict["zero_noise_steps"]
        self.noise_multiplier = state_dict["noise_multiplier"]
        self.delta = self.delta if self.delta is not None else state_dict["delta"]


def _validate_arguments(
    max_grad_norm, noise_multiplier, target_epsilon, delta, accountant, epsilon_budget, sample_rate
) -> None:
    def finite_positive(name: str, value: float | None, allow_zero: bool = False) -> None:
        if value is None:
            return
        ok = isinstance(value, (int, float)) and math.isfinite(value) and (value >= 0 if allow_zero else value > 0)
        if not ok:
            bound = ">= 0" if allow_zero else "> 0"
            raise MisconfigurationException(f"DPCallback({name}={value!r}) must be a finite number {bound}")

    finite_positive("max_grad_norm", max_grad_norm)
    finite_positive("noise_multiplier", noise_multiplier, allow_zero=True)
    finite_positive("target_epsilon", target_epsilon)
    finite_positive("epsilon_budget", epsilon_budget)
    finite_positive("delta", delta)
    finite_positive("sample_rate", sample_rate)
    if (noise_multiplier is None) == (target_epsilon is None):
        raise MisconfigurationException(
            "DPCallback needs exactly one of noise_multiplier or target_epsilon "
            f"(got noise_multiplier={noise_multiplier}, target_epsilon={target_epsilon})"
        )
    if delta is not None and delta >= 1:
        raise MisconfigurationException(f"DPCallback(delta={delta}) must be < 1 (typically 1/(10 n))")
    if sample_rate is not None and sample_rate > 1:
        raise MisconfigurationException(f"DPCallback(sample_rate={sample_rate}) must be <= 1")
    if accountant not in ACCOUNTANTS:
        raise MisconfigurationException(f"DPCallback(accountant={accountant!r}) must be one of {ACCOUNTANTS}")
    if noise_multiplier == 0:
        rank_zero_warn("DPCallback(noise_multiplier=0): clipping only, NO privacy guarantee (epsilon = inf)")


__all__ = ["DPCallback", "StopReason"]
