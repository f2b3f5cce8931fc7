"""``DPCallback``: the whole DP-SGD guarantee (sampling, clipping, noise, accounting) in one Lightning callback."""

from __future__ import annotations

import enum
import math
from functools import partial
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from torch import Tensor
from typing_extensions import override

from lightning_dprobust.callbacks.dp_arguments import check_choice, check_flag, check_mechanism, check_number
from lightning_dprobust.callbacks.dp_checks import (
    check_accumulation,
    check_module,
    check_optimizer,
    check_trainer,
    guard_single_optimizer,
    release_optimizer_guard,
)
from lightning_dprobust.callbacks.dp_guard import (
    BufferWatch,
    PrivateStepBypassed,
    PrivateStepGuard,
    guard_optimizer_step,
)
from lightning_dprobust.callbacks.dp_loader import PoissonLoaderFactory
from lightning_dprobust.callbacks.dp_planning import calibrate, planned_steps, resolve_delta, steps_within_budget
from lightning_dprobust.callbacks.dp_randomness import DPRandomness
from lightning_dprobust.core.accounting import DEFAULT_ACCOUNTANT, DeltaAndAccountant, PrivacyLedger
from lightning_dprobust.core.engines import build_clipper
from lightning_dprobust.core.per_sample import CLIPPING_RULES, add_noise_and_scale_


class StopReason(enum.Enum):
    """Why ``DPCallback`` stopped training."""

    BUDGET_EXHAUSTED = "privacy budget exhausted"


class DPCallback(Callback, DeltaAndAccountant):
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
    5. the step is recorded in a privacy ledger; ``privacy/epsilon`` is logged at each epoch end, printed at the
       end of ``fit`` and added to ``test``'s metrics;
    6. inside the optimizer's step, after every hook that can touch ``.grad`` and before the update, the gradient of
       every tensor the optimizer updates is made (one process: handed over once no other gradient is found in
       ``.grad``) or verified (DDP) to be exactly the private one of exactly one private step
       (:class:`~lightning_dprobust.callbacks.dp_guard.PrivateStepGuard`), and the module's buffers to be those of
       the step's start (:class:`~lightning_dprobust.callbacks.dp_guard.BufferWatch`); anything else stops the run
       with the buffers restored. An optimizer that calls its closure twice in one step (``LBFGS``) is refused. In
       one process, hooks that run before the update (``on_after_backward``, ``on_before_optimizer_step``) see
       ``.grad = None``; ``on_train_batch_end`` sees the applied private gradient.

    The masks of step 1 and the noise of step 3 come from generators the callback seeds from the operating system's
    entropy at each ``fit`` (:class:`~lightning_dprobust.callbacks.dp_randomness.DPRandomness`), never from the
    global torch RNG: ``seed_everything``, the config and any attack that reseeds the global RNG leave them secret,
    and neither a resume nor a second ``fit`` replays them.

    Guarantees:
        The released parameters satisfy ``(epsilon, delta)``-DP with respect to adding or removing one training
        example, with ``epsilon`` as reported by the chosen accountant (``pld`` default, ``prv``, ``rdp``; ``gdp`` is
        only an approximation, see :mod:`lightning_dprobust.core.accounting`).
        The ledger is part of the checkpoint, so a resumed run reports the epsilon of all steps taken; under
        ``target_epsilon`` a resume recalibrates the remaining steps against it (or refuses), and training stops
        before any step would exceed ``target_epsilon`` or ``epsilon_budget``.

    Assumptions (each violation is refused at setup with a message that says how to fix it):
        one optimizer that evaluates its closure once per step (not ``LBFGS``); no gradient accumulation (checked at
        every step); no buffer written by a training step (checked at every step); no fp16 or ``bf16-true`` precision
        (``bf16-mixed`` is accepted; the ghost engine computes the private step in float32 under it); no
        resume from a checkpoint without a DP ledger; a default delta of at most 1e-3; no Lightning gradient
        clipping; no BatchNorm or other layer mixing examples; the train loader built by this callback (Poisson
        sampling), unless ``poisson_sampling=False`` is set, in which case the loader's own batches (a uniform
        shuffle without replacement) are used and the reported epsilon is only an approximation. Per-step training
        metrics are not logged, since they are not covered by the guarantee.

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
        seed: ``None`` (default): secret randomness. An int: reproducibility mode for tests and debugging (warned):
            masks and noise follow from the seed, a resume continues them exactly; the guarantee then assumes the
            seed is secret and trains one model.
        engine: per-example clipping engine: ``"vmap"`` (``torch.func``, any model), ``"ghost"`` (ghost norms and
            book-keeping, close to non-private cost) or ``"auto"`` (ghost when every layer has a rule); the choice
            is logged. Same guarantee either way, for a per-example loss that never mixes examples; ``"ghost"``
            checks that against ``"vmap"``, in training mode, at the first step and every 100 steps, not at every
            step, so use ``"vmap"`` for losses that change during training (see
            :mod:`lightning_dprobust.core.engines`).
        on_late_mismatch: what a failed check of the ghost engine after its first does (the steps since the last
            passing check had no bounded sensitivity): ``"raise"`` (default) stops the run; ``"fallback"`` goes on
            with ``"vmap"`` and reports epsilon as infinite from then on (those steps are counted, and kept in the
            checkpoint).
        probe: the ghost engine's per-step probe (:class:`~lightning_dprobust.core.ghost.GhostClipper`): a loss or
            layer that starts to mix examples' losses is found at the step it starts instead of at the next periodic
            check; off by default (about 20 % of a ``cnn_tanh`` step at batch 64 on one CPU thread).

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
        seed: int | None = None,
        engine: str = "auto",
        on_late_mismatch: str = "raise",
        probe: bool = False,
    ) -> None:
        _validate_arguments(
            max_grad_norm, noise_multiplier, target_epsilon, delta, accountant, epsilon_budget, sample_rate, engine
        )
        check_choice("DPCallback", "clipping", clipping, CLIPPING_RULES)
        check_choice("DPCallback", "on_late_mismatch", on_late_mismatch, ("raise", "fallback"))
        check_flag("DPCallback", "poisson_sampling", poisson_sampling)
        check_flag("DPCallback", "probe", probe)
        self.engine = engine
        self.on_late_mismatch = on_late_mismatch
        self.probe = probe
        self.clipping = clipping
        self.max_grad_norm = float(max_grad_norm)
        self.noise_multiplier = noise_multiplier
        self.target_epsilon = target_epsilon
        self.delta = delta
        self.accountant = accountant
        self.epsilon_budget = epsilon_budget
        self.poisson_sampling = poisson_sampling
        self.max_physical_batch_size = max_physical_batch_size
        self.randomness = DPRandomness(seed)
        self.loaders = PoissonLoaderFactory(sample_rate, self.randomness.mask_seed, poisson=poisson_sampling)
        self.ledger = PrivacyLedger()
        self.guard = PrivateStepGuard()
        self.buffers = BufferWatch()
        self._unguard_optimizer = None
        self.stop_reason: StopReason | None = None
        self._requested_noise = noise_multiplier
        self._checkpoint_noise: float | None = None
        self._budget_steps: int | None = None
        self._clipper = None
        self._world_size = 1
        self._rank = 0
        self._module_id: int | None = None
        self._zero_noise_steps = 0
        self._unbounded_steps = 0

    # ----------------------------------------------------------------------------------------------- lifecycle
    @override
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        check_module(pl_module)
        self._check_same_model(pl_module)
        check_trainer(trainer, self.poisson_sampling)
        self._world_size, self._rank = trainer.world_size, trainer.global_rank
        self.randomness.next_fit()
        self.loaders.attach(trainer, pl_module)
        guard_single_optimizer(pl_module)
        self._clipper, choice = build_clipper(
            self.engine,
            pl_module,
            "per_example_loss",
            self.max_grad_norm,
            self.max_physical_batch_size,
            self.clipping,
            on_late_mismatch=self.on_late_mismatch,
            probe=self.probe,
        )
        rank_zero_info(f"DPCallback: per-example clipping engine: {choice}")

    def _check_same_model(self, pl_module: L.LightningModule) -> None:
        """A callback whose ledger holds steps accounts one model: a second fit of another model would carry them."""
        if self.ledger.steps and self._module_id not in (None, id(pl_module)):
            raise MisconfigurationException(
                f"DPCallback: this callback already accounted {self.ledger.steps} private steps of another model, "
                "and its ledger would carry them into this one; create a new DPCallback for each model"
            )
        self._module_id = id(pl_module)

    @override
    def on_load_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]) -> None:
        if trainer.state.fn == TrainerFn.FITTING and self.state_key not in (checkpoint.get("callbacks") or {}):
            raise MisconfigurationException(
                "DPCallback: the checkpoint to resume holds no DP ledger: its parameters were trained without "
                "DPCallback, so no epsilon can be claimed for them. Start a private run from scratch (no --ckpt_path)"
            )

    @override
    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.randomness.start(trainer)

    @override
    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.loaders.check_train_loader(trainer.train_dataloader, self._world_size)
        self.delta = resolve_delta(self.delta, self.loaders.num_examples)
        self._plan(trainer)
        optimizer = check_optimizer(trainer)
        self._unguard_optimizer = guard_optimizer_step(optimizer, partial(self._verify_step, trainer, optimizer))
        pl_module.private_step = self.private_step
        rank_zero_info(
            f"DPCallback: noise_multiplier={self.noise_multiplier:.4f}, max_grad_norm={self.max_grad_norm}, "
            f"sample_rate={self.loaders.sample_rate:.5f}, delta={self.delta:g}, accountant={self.accountant}, "
            f"randomness={self.randomness.label}"
        )

    @override
    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        check_accumulation(trainer)
        self.guard.reset()
        self.buffers.snapshot(pl_module)

    def _verify_step(self, trainer: L.Trainer, optimizer: Any) -> None:
        """Run inside the optimizer's step, after its closure: the private gradient and unchanged buffers."""
        reduce = None
        if self._world_size > 1:
            reduce = partial(trainer.strategy.reduce, reduce_op="mean")
        self.buffers.verify()
        self.guard.verify_optimizer(optimizer, self._clipper.trainable_parameters(), reduce)

    @override
    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        if self.guard.pending:
            raise PrivateStepBypassed(
                "DPCallback: a private step ran but the optimizer step that followed was not the guarded one (the "
                "optimizer was replaced during fit, or stepped outside Lightning's loop); its update was not verified"
            )
        if self._budget_steps is not None and self.ledger.steps >= self._budget_steps:
            trainer.should_stop = True
            trainer.fit_loop.min_epochs = None  # a privacy limit overrides min_epochs / min_steps
            trainer.fit_loop.epoch_loop.min_steps = None
            if self.stop_reason is None:
                self.stop_reason = StopReason.BUDGET_EXHAUSTED
                rank_zero_info(
                    f"DPCallback: stopping: {self.stop_reason.value} (spent {self.budgeted_epsilon():.4f} of "
                    f"{self._limit():.4f} after {self.ledger.steps} steps; min_epochs / min_steps no longer apply)"
                )

    @override
    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        self.buffers.restore()  # a step stopped midway leaves no buffer written from its private batch

    @override
    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        pl_module.log("privacy/epsilon", self.epsilon(), sync_dist=False, rank_zero_only=False)

    @override
    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.delta is None:  # no training step ran (e.g. limit_train_batches=0): nothing was released
            return
        rank_zero_info(
            f"DPCallback: final epsilon={self.epsilon():.4f}, delta={self.delta:g}, accountant={self.accountant}, "
            f"steps={self.ledger.steps + self._zero_noise_steps}"
        )

    @override
    def on_test_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if (self.ledger.steps or self._zero_noise_steps) and self.delta is not None:
            pl_module.log("privacy/epsilon", self.epsilon(), sync_dist=False, rank_zero_only=False)

    @override
    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage == "fit":
            pl_module.private_step = None
            if self._unguard_optimizer is not None:
                self._unguard_optimizer()
                self._unguard_optimizer = None
            self.loaders.detach()
            release_optimizer_guard(pl_module)

    # ------------------------------------------------------------------------------------------- the DP step
    def private_step(self, inputs: tuple[Tensor, ...]) -> Tensor:
        """Clip, sum, noise and account one batch; returns the loss the training step returns.

        The private gradient reaches ``p.grad`` through
        :meth:`~lightning_dprobust.callbacks.dp_guard.PrivateStepGuard.release`: in one process it is handed to the
        optimizer inside its step, after every hook (the loss is a constant, so Lightning's loop runs unchanged);
        under DDP a surrogate loss's backward writes it, so DDP's all-reduce runs as for any gradient, and the guard
        compares it before the optimizer step.
        """
        if self._budget_steps is not None and self.ledger.steps >= self._budget_steps:
            raise RuntimeError(f"DPCallback: the privacy limit {self._limit()} is spent; no further step is allowed")
        params = self._clipper.trainable_parameters()
        for p in params.values():  # Lightning zeroes them before the backward anyway; freed now, they never coexist
            p.grad = None  # with this step's activations and clipped sum
        unbounded = self._clipper.unbounded_calls
        clipped = self._clipper(inputs)
        self._count_unbounded(self._clipper.unbounded_calls - unbounded)
        private = self._add_noise(clipped.grads)
        if self.noise_multiplier > 0:
            self.ledger.record(self.noise_multiplier, self.loaders.sample_rate)
        else:
            self._zero_noise_steps += 1
        return self.guard.release(params, private, hand_over=self._world_size == 1)

    def _count_unbounded(self, steps: int) -> None:
        if steps:
            self._unbounded_steps += steps
            rank_zero_warn(
                f"DPCallback: {steps} released steps were found, at a later check, to have no bounded sensitivity "
                "(on_late_mismatch='fallback'): epsilon is infinite from now on; the run goes on with engine='vmap'"
            )

    def _add_noise(self, grads: dict[str, Tensor]) -> dict[str, Tensor]:
        """The release (:func:`~lightning_dprobust.core.per_sample.add_noise_and_scale_`) of the clipped sum, in
        place: ``(sum + N(0, (sigma C)^2)) * scale``; the noise is drawn on rank 0 only (the other ranks' sums are
        all-reduced into it)."""
        std = self.noise_multiplier * self.max_grad_norm if self._rank == 0 else 0.0
        device = next(iter(grads.values())).device
        generator = self.randomness.noise_generator(self.ledger.steps + self._zero_noise_steps, device)
        scale = self._world_size / (self.loaders.sample_rate * self.loaders.num_examples)
        return dict(add_noise_and_scale_(grads, std, scale, generator))

    # ------------------------------------------------------------------------------------------- accounting
    def epsilon(self, delta: float | None = None) -> float:
        """Epsilon spent so far at ``delta`` (default: the callback's delta); ``inf`` after any noiseless step or any
        step found to have unbounded sensitivity."""
        if self._zero_noise_steps or self._unbounded_steps:
            return math.inf
        return self.ledger.epsilon(delta or self.delta, self.accountant)

    def budgeted_epsilon(self) -> float:
        """The epsilon ``target_epsilon`` and ``epsilon_budget`` bound: the guarantee's."""
        return self.epsilon()

    def _limit(self) -> float:
        return min(limit for limit in (self.target_epsilon, self.epsilon_budget) if limit is not None)

    def _plan(self, trainer: L.Trainer) -> None:
        """Noise multiplier (calibrated against the ledger under a target) and the step limit of this fit."""
        rate, limits = self.loaders.sample_rate, []
        if self.target_epsilon is not None:
            total = planned_steps(trainer, self.loaders.steps_per_epoch)
            self.noise_multiplier = calibrate(
                self.target_epsilon, self.delta, rate, total, self.ledger, self.accountant, self._checkpoint_noise
            )
            limits.append(total)
        else:
            self.noise_multiplier = self._requested_noise
        if self._checkpoint_noise is not None and self._checkpoint_noise != self.noise_multiplier:
            rank_zero_warn(
                f"DPCallback: resuming with noise_multiplier={self.noise_multiplier:.4g} after steps at "
                f"{self._checkpoint_noise:.4g}; the ledger composes both"
            )
        if self.epsilon_budget is not None:
            limits.append(
                steps_within_budget(
                    self.epsilon_budget, self.delta, self.noise_multiplier, rate, self.ledger, self.accountant
                )
            )
        self._budget_steps = min(limits) if limits else None

    # ----------------------------------------------------------------------------------------- checkpointing
    @override
    def state_dict(self) -> dict[str, Any]:
        """Ledger and mechanism; in secret mode no randomness at all (see :class:`DPRandomness`)."""
        return {
            "ledger": self.ledger.state_dict(),
            "zero_noise_steps": self._zero_noise_steps,
            "unbounded_steps": self._unbounded_steps,
            "noise_multiplier": self.noise_multiplier,
            "max_grad_norm": self.max_grad_norm,
            "sample_rate": self.loaders.sample_rate,
            "delta": self.delta,
            "accountant": self.accountant,
            "randomness": self.randomness.state_dict(),
        }

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        for key in ("max_grad_norm", "accountant"):
            if state_dict[key] != getattr(self, key):
                raise MisconfigurationException(
                    f"DPCallback: the checkpoint was trained with {key}={state_dict[key]!r} but this run has "
                    f"{key}={getattr(self, key)!r}; resume with the same value so the accounting stays valid"
                )
        self.ledger.load_state_dict(state_dict["ledger"])
        self._zero_noise_steps = state_dict["zero_noise_steps"]
        self._unbounded_steps = state_dict.get("unbounded_steps", 0)
        self._checkpoint_noise = state_dict["noise_multiplier"]
        self.delta = self.delta if self.delta is not None else state_dict["delta"]
        self.randomness.load_state_dict(state_dict.get("randomness", {}))


def _validate_arguments(
    max_grad_norm, noise_multiplier, target_epsilon, delta, accountant, epsilon_budget, sample_rate, engine
) -> None:
    check_mechanism("DPCallback", max_grad_norm, noise_multiplier, accountant, engine)
    for name, value in (
        ("target_epsilon", target_epsilon),
        ("epsilon_budget", epsilon_budget),
        ("delta", delta),
        ("sample_rate", sample_rate),
    ):
        check_number("DPCallback", name, value)
    if (noise_multiplier is None) == (target_epsilon is None):
        raise MisconfigurationException(
            "DPCallback needs exactly one of noise_multiplier or target_epsilon "
            f"(got noise_multiplier={noise_multiplier}, target_epsilon={target_epsilon})"
        )
    if delta is not None and delta >= 1:
        raise MisconfigurationException(f"DPCallback(delta={delta}) must be < 1 (typically 1/(10 n))")
    if sample_rate is not None and sample_rate > 1:
        raise MisconfigurationException(f"DPCallback(sample_rate={sample_rate}) must be <= 1")
    if noise_multiplier == 0:
        rank_zero_warn("DPCallback(noise_multiplier=0): clipping only, NO privacy guarantee (epsilon = inf)")


__all__ = ["DPCallback", "StopReason"]
