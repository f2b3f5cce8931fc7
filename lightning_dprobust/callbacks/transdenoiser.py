"""``TransDenoiserCallback``: DP-SGD whose Gaussian noise is topped up from the transformed input noise.

Tang 2021 (PhD thesis, Emory University), chapter 6, Algorithm 3, Theorems 4/5 and Corollary 2.
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import lightning as L
import numpy as np
import torch
import torch.distributed as dist
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from torch import Tensor

from lightning_dprobust.callbacks.dp import DPCallback
from lightning_dprobust.core.accounting import (
    DEFAULT_RDP_ORDERS,
    NominalEvent,
    compute_rdp,
    epsilon_for,
    rdp_to_epsilon,
)
from lightning_dprobust.core.per_sample import _LossModule, add_noise_and_scale_, clip_factors, stateless_call
from lightning_dprobust.core.transdenoiser_math import (
    input_jacobians,
    rank_allows,
    s_min,
    taylor_remainders,
    top_up_multiplier,
    transformation_matrix,
)

MODES = ("transdenoiser", "sepdp")
NOMINAL_SOURCE = "thesis Theorem 5: transformed input noise counted as gradient noise xi_up"
"""Ledger name of the thesis's claim: every step accounted at ``xi_up`` (nominal, never a guarantee)."""
NOMINAL_WARNING = (
    "NOT a differential-privacy guarantee (Lemma 1 compares gradient vectors with '>=' and the factor T of "
    "Lemmas 2/3 assumes input noise drawn once; Algorithm 3 draws it at every step)"
)


class VanishingNoiseError(RuntimeError):
    """A slice's ``sigma_bar`` leaves no Gaussian noise that gives a finite epsilon within the budget."""


class TransDenoiserCallback(DPCallback):
    """Trains a :class:`~lightning_dprobust.methods.TransDenoiser` with Algorithm 3 of Tang 2021 (chapter 6).

    Everything but the noise scale is ``DPCallback``'s: Poisson sampling, flat per-example clipping of the whole
    denoiser gradient to ``max_grad_norm`` (the shared vmap engine of ``core/per_sample.py``: the Taylor remainders
    need per-example losses, which the ghost engine does not compute), the setup checks, the secret randomness the
    noise is drawn from, the check that the optimizer applies exactly the private gradient, the final epsilon line,
    and the ledger. ``T``, the planned number of steps of the top-up rule, is the smaller of the trainer's length and
    the number of steps ``target_epsilon`` allows at ``xi_up``. The release is ``DPCallback``'s too
    (:func:`~lightning_dprobust.core.per_sample.add_noise_and_scale_`), slice by slice (:func:`release_slices_`).

    At each step, for each parameter slice ``s`` (first / middle / last, App. .13) the noise std on the clipped sum
    is ``sigma_bar_s * max_grad_norm``:

    * ``mode="sepdp"``: ``sigma_bar_s = xi_up`` (separate gradient perturbation, no transformation);
    * ``mode="transdenoiser"``: the Taylor remainders split the batch (Alg. 3 lines 8-11). When some example is
      a negative case, ``sigma_bar_s = xi_up``. Otherwise, for a slice in ``transform_slices`` that passes the rank
      guard, ``sigma_bar_s = top_up_multiplier(xi_up, xi_low, S_min(M_s), sigma, T)`` with
      ``M_s = (1/C^2) sum_i a_i^2 A_i A_i^T``; every other slice gets ``xi_up``.

    Algorithm 3 adds independent draws to the non-negative and the negative partial sums, of which only the total
    is released; one draw at the larger of the two scales gives every example at least the scale its case needs
    (the thesis's argument) with less noise, and makes ``sepdp``'s noise an upper bound of ``transdenoiser``'s.

    Guarantees / assumptions (docs/design.md, contract 12):
        ``mode="sepdp"`` records ``xi_up`` at every step and is DP-SGD: :meth:`epsilon` is a guarantee.
        ``mode="transdenoiser"`` offers **no DP guarantee** (:meth:`epsilon` is ``inf``): its noise scale
        ``sigma_bar`` is a function of the private batch (through ``S_min``), and a Gaussian mechanism whose variance
        depends on the data is not differentially private in general (the variance itself can reveal the data).
        The ledger records the Gaussian noise actually added: each step is a Poisson-subsampled Gaussian mechanism
        (Mironov, Talwar, Zhang 2019) at ``min_s sigma_bar_s``, the smallest multiplier over the slices (each slice's
        noise is at least that); :meth:`added_noise_epsilon` is that history's epsilon, which would be the guarantee
        if the choice of scale revealed nothing (not proven, in the thesis or here). It is reported as **nominal**
        (``privacy/nominal_added_epsilon``), tighter than the thesis's claim only where ``sigma_bar`` stays close to
        ``xi_up``; the ledger (checkpointed) holds that data-dependent sequence.

        The thesis's Theorem 5 (every step as if at ``xi_up``, counting the transformed input noise as gradient
        noise) is kept beside it as a :class:`~lightning_dprobust.core.accounting.NominalEvent`
        (:meth:`thesis_claim`), logged as ``privacy/nominal_epsilon`` and printed as nominal, never as a guarantee.

        ``target_epsilon`` bounds :meth:`added_noise_epsilon` (checked on its RDP bound, then on ``accountant``): a step
        whose ``sigma_bar`` would overspend gets ``xi_up`` on every slice, and training stops when not even that
        fits. A ``sigma_bar`` of 0 (or so small that one step alone spends more than the budget) stops the run with
        :class:`VanishingNoiseError`, unless ``thesis_accounting=True``: then the ledger holds the thesis's accounting
        marked nominal, ``epsilon()`` is ``inf`` (no DP guarantee) and the thesis's epsilon is printed as nominal.

        The gradient noise comes from ``DPCallback``'s secret generators
        (:class:`~lightning_dprobust.callbacks.dp_randomness.DPRandomness`; ``seed`` is its warned test mode).

    Args:
        mode: ``"transdenoiser"`` or ``"sepdp"`` (train without this callback for ``nodp``).
        xi_up: overall gradient noise multiplier (the thesis: 2.0).
        xi_low: below this transformed multiplier the transformation is ignored (``sigma_bar = xi_up``).
        target_epsilon: the privacy budget of the recorded epsilon (the thesis: 1.0).
        transform_slices: the slices whose noise may be reduced (the authors' code: first and last).
        thesis_accounting: opt into the thesis's claim: no DP guarantee (``epsilon()`` is ``inf``), the epsilon of
            Theorem 5 recorded as nominal, and a ``sigma_bar`` of 0 allowed.
        **kwargs: ``max_grad_norm``, ``delta``, ``accountant``, ``sample_rate``, ``poisson_sampling``,
            ``max_physical_batch_size``, ``seed`` of :class:`DPCallback` (``engine`` is always ``"vmap"``;
            ``"ghost"`` is refused, as is any ``clipping`` but ``"flat"``: the transformation assumes both).

    Example:
        >>> from lightning_dprobust.callbacks import TransDenoiserCallback
        >>> callback = TransDenoiserCallback(xi_up=2.0, target_epsilon=1.0, delta=1e-5)
    """

    def __init__(
        self,
        mode: str = "transdenoiser",
        xi_up: float = 2.0,
        xi_low: float = 0.0,
        target_epsilon: float = 1.0,
        transform_slices: tuple[str, ...] | list[str] = ("first", "last"),
        thesis_accounting: bool = False,
        **kwargs: Any,
    ) -> None:
        if mode not in MODES:
            raise MisconfigurationException(f"TransDenoiserCallback(mode={mode!r}) must be one of {MODES}")
        if not (isinstance(xi_up, (int, float)) and xi_up > 0 and 0 <= xi_low <= xi_up):
            raise MisconfigurationException(
                f"TransDenoiserCallback needs xi_up > 0 and 0 <= xi_low <= xi_up, got xi_up={xi_up}, xi_low={xi_low}"
            )
        if not isinstance(thesis_accounting, bool):
            raise MisconfigurationException(
                f"TransDenoiserCallback(thesis_accounting={thesis_accounting!r}) must be True or False"
            )
        if kwargs.get("engine", "auto") not in ("auto", "vmap") or kwargs.get("clipping", "flat") != "flat":
            raise MisconfigurationException(
                f"TransDenoiserCallback(engine={kwargs.get('engine')!r}, clipping={kwargs.get('clipping')!r}) is not "
                "supported: the transformation needs per-example losses (engine 'vmap') and the flat clip factors "
                "(clipping 'flat'); remove both arguments"
            )
        kwargs["engine"] = "vmap"  # "auto" could pick the ghost engine, which computes no per-example losses
        super().__init__(noise_multiplier=float(xi_up), epsilon_budget=target_epsilon, **kwargs)
        self.mode = mode
        self.xi_up = float(xi_up)
        self.xi_low = float(xi_low)
        self.transform_slices = tuple(transform_slices)
        self.thesis_accounting = thesis_accounting
        self.planned_steps = 0
        self.fallback_steps = 0
        self.last_multipliers: dict[str, float] = {}
        self._module: Any = None
        self._slices: dict[str, list[str]] = {}
        self._history_rdp: np.ndarray | None = None

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage == "fit" and not all(hasattr(pl_module, a) for a in ("parameter_slices", "denoising_loss")):
            raise MisconfigurationException(
                f"TransDenoiserCallback trains a lightning_dprobust.methods.TransDenoiser, got "
                f"{type(pl_module).__name__}: use DPCallback for classifiers"
            )
        super().setup(trainer, pl_module, stage)
        if stage == "fit":
            self._module = pl_module
            self._slices = pl_module.parameter_slices()
            sliced = [name for names in self._slices.values() for name in names]
            trainable = [name for name, p in pl_module.named_parameters() if p.requires_grad]
            if sorted(sliced) != sorted(trainable):
                raise MisconfigurationException(
                    "TransDenoiserCallback: the parameter slices must cover every trainable parameter exactly once "
                    f"(slices: {sorted(sliced)}, trainable: {sorted(trainable)}); freeze the public classifier"
                )
            unknown = set(self.transform_slices) - set(self._slices)
            if unknown:
                raise MisconfigurationException(
                    f"TransDenoiserCallback(transform_slices={list(self.transform_slices)}) names unknown slices "
                    f"{sorted(unknown)}; choose from {sorted(self._slices)}"
                )

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_train_start(trainer, pl_module)
        self._stop_unless_a_full_step_fits()
        planned = self._budget_steps
        if trainer.max_steps is not None and trainer.max_steps > 0:
            planned = min(planned, trainer.max_steps)
        if trainer.max_epochs is not None and trainer.max_epochs > 0:
            planned = min(planned, trainer.max_epochs * self.loaders.steps_per_epoch)
        self.planned_steps = max(1, planned)
        if self.thesis_accounting:
            rank_zero_warn(
                f"TransDenoiserCallback(thesis_accounting=True): epsilon = inf; the thesis's is {NOMINAL_WARNING}"
            )

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        self._stop_unless_a_full_step_fits()
        super().on_train_batch_end(trainer, pl_module, *args)

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_train_epoch_end(trainer, pl_module)
        pl_module.log("privacy/nominal_epsilon", self.thesis_claim().epsilon, rank_zero_only=True)
        if self.mode == "transdenoiser" and not self.thesis_accounting:
            pl_module.log("privacy/nominal_added_epsilon", self.added_noise_epsilon(), rank_zero_only=True)

    def epsilon(self, delta: float | None = None) -> float:
        """The DP guarantee: ``sepdp``'s; ``inf`` for ``mode="transdenoiser"``, whose noise scale depends on the
        private batch (class docstring)."""
        if self.mode == "transdenoiser":
            return math.inf
        return super().epsilon(delta)

    def budgeted_epsilon(self) -> float:
        """``target_epsilon`` bounds the epsilon of the noise added (nominal in the top-up mode)."""
        return self.added_noise_epsilon()

    def added_noise_epsilon(self, delta: float | None = None) -> float:
        """The epsilon of the Gaussian noise added, each step at its smallest ``sigma_bar`` taken as given: nominal
        for ``mode="transdenoiser"`` (the scale depends on the private batch), the guarantee for ``sepdp``."""
        return super().epsilon(delta)

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_fit_end(trainer, pl_module)
        if self.delta is not None and self.ledger.steps:
            rank_zero_info(f"TransDenoiserCallback: {self.privacy_summary()}")

    # ------------------------------------------------------------------------------------------- the DP step
    def private_step(self, inputs: tuple[Tensor, ...]) -> Tensor:
        """Clip, sum, add the (topped-up) noise per slice, record it; returns the training step's loss.

        As in :meth:`DPCallback.private_step`, the private gradient is released through the guard, which hands it to
        the optimizer (or verifies it, under DDP) and refuses the step if anything else reaches ``.grad``.
        """
        if self._budget_steps is not None and self.ledger.steps >= self._budget_steps:
            raise RuntimeError(f"TransDenoiserCallback: target_epsilon={self.epsilon_budget} is spent")
        clipped = self._clipper(inputs)
        multipliers = self.slice_multipliers(inputs, clipped.losses, clipped.norms)
        if not self.thesis_accounting:
            multipliers = self._guaranteed(multipliers)
        self.last_multipliers = multipliers
        generator = self.randomness.noise_generator(self.ledger.steps, inputs[0].device)
        stds = {key: multipliers[key] * self.max_grad_norm if self._rank == 0 else 0.0 for key in self._slices}
        scale = self._world_size / (self.loaders.sample_rate * self.loaders.num_examples)
        private = release_slices_(clipped.grads, self._slices, stds, scale, generator)
        self._account(min(multipliers.values()))
        params = self._clipper.trainable_parameters()
        return self.guard.release(params, private, hand_over=self._world_size == 1)

    def slice_multipliers(self, inputs: tuple[Tensor, ...], losses_z: Tensor, norms: Tensor) -> dict[str, float]:
        """``sigma_bar`` of each slice for this batch (see the class docstring); identical on every DDP rank."""
        full = {key: self.xi_up for key in self._slices}
        if self.mode == "sepdp":
            return full
        x, z = inputs
        module = self._module
        remainders = taylor_remainders(module.denoising_loss, x, z, losses_z)
        non = remainders >= 0
        counts = _all_reduce(torch.stack([non.sum(), (~non).sum()]).double(), dist.ReduceOp.SUM)
        if counts[1] > 0 or counts[0] == 0:
            return full
        factors = clip_factors(norms[non], self.max_grad_norm)
        sigma, input_dim = module.current_sigma(), x[0].numel()
        for key in self.transform_slices:
            names = self._slices[key]
            width = sum(module.get_parameter(name).numel() for name in names)
            if not rank_allows(width, int(counts[0]), input_dim):
                warnings.warn(
                    f"TransDenoiserCallback: slice {key!r} has {width} parameters > {int(counts[0])} examples x "
                    f"{input_dim} inputs, so S_min(M) = 0 and it gets the full xi_up noise; keep slices small",
                    stacklevel=2,
                )
                continue
            matrix = _all_reduce(self._slice_matrix(names, x[non], factors), dist.ReduceOp.SUM)
            full[key] = top_up_multiplier(self.xi_up, self.xi_low, s_min(matrix), sigma, self.planned_steps)
        return full

    def _slice_matrix(self, names: list[str], x: Tensor, factors: Tensor) -> Tensor:
        """``(1/C^2) sum_i a_i^2 A_i A_i^T`` of one slice over this rank's non-negative cases."""
        frozen = {f"owner.{name}": p.detach() for name, p in self._module.named_parameters()}
        width = sum(frozen[f"owner.{name}"].numel() for name in names)
        if x.shape[0] == 0:
            return torch.zeros(width, width, device=factors.device)
        wrapper = _LossModule(self._module, "denoising_loss")

        def loss(slice_params: dict[str, Tensor], inputs: Tensor, target: Tensor) -> Tensor:
            params = {**frozen, **{f"owner.{name}": p for name, p in slice_params.items()}}
            return stateless_call(wrapper, params, (inputs[None], target[None])).sum()

        jacobians = input_jacobians(loss, {name: frozen[f"owner.{name}"] for name in names}, x)
        return transformation_matrix(jacobians, factors, self.max_grad_norm)

    # ------------------------------------------------------------------------------------------- accounting
    def _guaranteed(self, multipliers: dict[str, float]) -> dict[str, float]:
        """The multipliers to add under the guarantee: this step's, or ``xi_up`` everywhere when they would overspend.

        Raises:
            VanishingNoiseError: the smallest ``sigma_bar`` is 0, or so small that one step at it alone spends more
                than ``target_epsilon`` (any epsilon, without a budget, when it is infinite).
        """
        key = min(multipliers, key=multipliers.__getitem__)
        smallest = multipliers[key]
        alone = self._rdp_epsilon(self._step_rdp(smallest)) if smallest > 0 else math.inf
        limit = self.epsilon_budget if self.epsilon_budget is not None else math.inf
        if not (alone <= limit and math.isfinite(alone)):
            raise VanishingNoiseError(
                f"TransDenoiserCallback: sigma_bar = {smallest:.3g} on slice {key!r} at step {self.ledger.steps} "
                f"(T = {self.planned_steps} planned steps) gives no finite epsilon within target_epsilon={limit:g} "
                f"(one step spends {alone:.3g}): plan fewer steps (max_steps, or a smaller target_epsilon), raise "
                f"xi_up so that xi_up^2 > T S_min(M) sigma^2, drop {key!r} from transform_slices, or pass "
                "thesis_accounting=True for the thesis's nominal claim (no DP guarantee)"
            )
        if self._fits(smallest):
            return multipliers
        self.fallback_steps += 1
        return dict.fromkeys(multipliers, self.xi_up)

    def _account(self, smallest: float) -> None:
        """Record the step: at the smallest multiplier added, or, under ``thesis_accounting``, the thesis's ``xi_up``
        with its epsilon as a nominal claim (the ledger's epsilon is then ``inf``)."""
        if self.thesis_accounting:
            self.ledger.record(self.xi_up, self.loaders.sample_rate)
            claim = self.thesis_claim()
            self.ledger.record_nominal(claim.source, claim.epsilon, claim.delta)
            return
        self._history_rdp = self._recorded_rdp() + self._step_rdp(smallest)
        self.ledger.record(smallest, self.loaders.sample_rate)

    def _stop_unless_a_full_step_fits(self) -> None:
        """Make this the last step when not even a step at ``xi_up`` on every slice keeps the budget (RDP bound)."""
        if self.thesis_accounting or self._budget_steps is None:
            return
        if not self._fits(self.xi_up):
            self._budget_steps = min(self._budget_steps, self.ledger.steps)

    def _fits(self, multiplier: float) -> bool:
        """Whether one more step at ``multiplier`` keeps the recorded epsilon within ``target_epsilon``.

        Checked on the history's RDP bound first (kept up to date, milliseconds); when that bound is over the budget,
        on the configured accountant (tighter: ``pld``, ``prv``). Either is a valid guarantee, so a step that fits
        keeps the run ``(target_epsilon, delta)``-DP.
        """
        if self.epsilon_budget is None:
            return True
        if self._rdp_epsilon(self._recorded_rdp() + self._step_rdp(multiplier)) <= self.epsilon_budget:
            return True
        if self.accountant == "rdp":
            return False
        history = [*self.ledger.history, (multiplier, self.loaders.sample_rate, 1)]
        return epsilon_for(history, self.delta, self.accountant) <= self.epsilon_budget

    def _step_rdp(self, multiplier: float) -> np.ndarray:
        """RDP at :data:`DEFAULT_RDP_ORDERS` of one step at ``multiplier`` (Mironov, Talwar, Zhang 2019)."""
        return compute_rdp(self.loaders.sample_rate, multiplier, 1)

    def _recorded_rdp(self) -> np.ndarray:
        """RDP of the ledger's history, kept up to date step by step (RDP composes additively)."""
        if self._history_rdp is None:
            self._history_rdp = sum(
                (compute_rdp(e.sample_rate, e.noise_multiplier, e.steps) for e in self.ledger.history),
                np.zeros(len(DEFAULT_RDP_ORDERS)),
            )
        return self._history_rdp

    def _rdp_epsilon(self, rdp: np.ndarray) -> float:
        return rdp_to_epsilon(DEFAULT_RDP_ORDERS, rdp, self.delta)[0]

    def thesis_claim(self) -> NominalEvent:
        """The thesis's epsilon for the steps taken (Theorem 5: each step at ``xi_up``), as a nominal claim."""
        history = [(self.xi_up, e.sample_rate, e.steps) for e in self.ledger.history]
        return NominalEvent(NOMINAL_SOURCE, epsilon_for(history, self.delta, self.accountant), self.delta)

    def privacy_summary(self) -> str:
        """One line: the guarantee of the noise added (with its ``sigma_bar`` per step) beside the nominal claim."""
        if self.thesis_accounting:
            return f"{self.ledger.nominal_summary()}: {NOMINAL_WARNING}"
        added = self.ledger.history
        smallest = min(e.noise_multiplier for e in added)
        mean = sum(e.noise_multiplier * e.steps for e in added) / self.ledger.steps
        added = (
            f"epsilon={self.added_noise_epsilon():.4f} (delta={self.delta:g}, {self.accountant}) for the Gaussian "
            f"noise added, the smallest sigma_bar over the slices at each step (min {smallest:.4g}, mean {mean:.4g}; "
            f"{self.fallback_steps} steps at xi_up to keep the budget)"
        )
        if self.mode == "sepdp":
            return f"{added} is the guarantee"
        return (
            f"no DP guarantee (epsilon = inf: sigma_bar is chosen from the private batch); nominal {added}, if that "
            f"choice revealed nothing; beside it, {self.thesis_claim().describe()}: {NOMINAL_WARNING}"
        )

    # ----------------------------------------------------------------------------------------- checkpointing
    def state_dict(self) -> dict[str, Any]:
        return {
            **super().state_dict(),
            "mode": self.mode,
            "xi_up": self.xi_up,
            "thesis_accounting": self.thesis_accounting,
            "fallback_steps": self.fallback_steps,
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        for key in ("mode", "xi_up", "thesis_accounting"):
            if state_dict.get(key, False if key == "thesis_accounting" else None) != getattr(self, key):
                raise MisconfigurationException(
                    f"TransDenoiserCallback: the checkpoint was trained with {key}={state_dict.get(key)!r}, this run "
                    f"has {key}={getattr(self, key)!r}; resume with the same value so the accounting stays valid"
                )
        super().load_state_dict(state_dict)
        self.fallback_steps = state_dict.get("fallback_steps", 0)
        self._history_rdp = None


def release_slices_(
    clipped_sum: dict[str, Tensor],
    slices: dict[str, list[str]],
    stds: dict[str, float],
    scale: float,
    generator: torch.Generator,
) -> dict[str, Tensor]:
    """The release (:func:`~lightning_dprobust.core.per_sample.add_noise_and_scale_`) of each slice's part of
    ``clipped_sum`` with noise std ``stds[slice]``, in place; returns ``clipped_sum``.

    One generator serves the slices in turn, so every coordinate gets its own draw. Guarantee: the whole clipped sum
    moves by at most ``C`` per example, so with ``stds[slice] = sigma_bar_slice C`` the release is at least as private
    as the Gaussian mechanism at the smallest ``sigma_bar`` (what ``TransDenoiserCallback`` records).
    """
    for key, names in slices.items():
        add_noise_and_scale_({name: clipped_sum[name] for name in names}, stds[key], scale, generator)
    return clipped_sum


def _all_reduce(tensor: Tensor, op: Any) -> Tensor:
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(tensor, op=op)
    return tensor


__all__ = ["MODES", "NOMINAL_SOURCE", "TransDenoiserCallback", "VanishingNoiseError", "release_slices_"]
