"""``TransDenoiserCallback``: DP-SGD whose Gaussian noise is topped up from the transformed input noise.

Tang 2021 (PhD thesis, Emory University), chapter 6, Algorithm 3, Theorems 4/5 and Corollary 2.
"""

from __future__ import annotations

import warnings
from typing import Any

import lightning as L
import torch
import torch.distributed as dist
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from torch import Tensor

from lightning_dprobust.callbacks.dp import DPCallback
from lightning_dprobust.callbacks.dp_guard import gradient_surrogate
from lightning_dprobust.core.per_sample import _LossModule, clip_factors, stateless_call
from lightning_dprobust.core.transdenoiser_math import (
    input_jacobians,
    rank_allows,
    s_min,
    taylor_remainders,
    top_up_multiplier,
    transformation_matrix,
)

MODES = ("transdenoiser", "sepdp")


class TransDenoiserCallback(DPCallback):
    """Trains a :class:`~lightning_dprobust.methods.TransDenoiser` with Algorithm 3 of Tang 2021 (chapter 6).

    Everything but the noise scale is ``DPCallback``'s: Poisson sampling, flat per-example clipping of the whole
    denoiser gradient to ``max_grad_norm`` (the shared vmap engine of ``core/per_sample.py``: the Taylor remainders
    need per-example losses, which the ghost engine does not compute), the setup checks, the secret randomness the
    noise is drawn from, the check that the optimizer applies exactly the private gradient, the final epsilon line,
    and the ledger,
    which records every step as a Gaussian mechanism with noise multiplier ``xi_up`` (Corollary 2) so epsilon is
    computed, budgeted and checkpointed like every other method's. ``target_epsilon`` is a budget: training stops
    before a step would spend more, and ``T``, the planned number of steps, is the smaller of the trainer's length
    and the budget's.

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

    Guarantees / assumptions:
        The guarantee is the thesis's Theorem 5: ``(epsilon, delta)``-DP as for DP-SGD with noise multiplier
        ``xi_up``, *if* the transformed input noise protects like Gaussian gradient noise (Lemma 1, whose "``>=``"
        between gradient vectors is not a DP argument, and the factor ``T`` of Lemmas 2/3, which assumes input
        noise drawn once): see ``core/transdenoiser_math.py``. ``sepdp`` needs no such assumption (it is DP-SGD).
        ``sigma_bar`` depends on the private batch, so it is never logged or checkpointed. The gradient noise comes
        from ``DPCallback``'s secret generators (:class:`~lightning_dprobust.callbacks.dp_randomness.DPRandomness`;
        ``seed`` is its warned reproducibility mode).

    Args:
        mode: ``"transdenoiser"`` or ``"sepdp"`` (train without this callback for ``nodp``).
        xi_up: overall gradient noise multiplier (the thesis: 2.0).
        xi_low: below this transformed multiplier the transformation is ignored (``sigma_bar = xi_up``).
        target_epsilon: the privacy budget (the thesis: 1.0).
        transform_slices: the slices whose noise may be reduced (the authors' code: first and last).
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
        **kwargs: Any,
    ) -> None:
        if mode not in MODES:
            raise MisconfigurationException(f"TransDenoiserCallback(mode={mode!r}) must be one of {MODES}")
        if not (isinstance(xi_up, (int, float)) and xi_up > 0 and 0 <= xi_low <= xi_up):
            raise MisconfigurationException(
                f"TransDenoiserCallback needs xi_up > 0 and 0 <= xi_low <= xi_up, got xi_up={xi_up}, xi_low={xi_low}"
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
        self.planned_steps = 0
        self.last_multipliers: dict[str, float] = {}
        self._module: Any = None
        self._slices: dict[str, list[str]] = {}

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
        planned = self._budget_steps
        if trainer.max_steps is not None and trainer.max_steps > 0:
            planned = min(planned, trainer.max_steps)
        if trainer.max_epochs is not None and trainer.max_epochs > 0:
            planned = min(planned, trainer.max_epochs * self.loaders.steps_per_epoch)
        self.planned_steps = max(1, planned)

    # ------------------------------------------------------------------------------------------- the DP step
    def private_step(self, inputs: tuple[Tensor, ...]) -> Tensor:
        """Clip, sum, add the (topped-up) noise per slice, record ``xi_up``; returns the surrogate loss.

        As in :meth:`DPCallback.private_step`, the surrogate's gradient is exactly the private gradient, which is
        registered with the guard so the optimizer step is refused if anything else reaches ``.grad``.
        """
        if self._budget_steps is not None and self.ledger.steps >= self._budget_steps:
            raise RuntimeError(f"TransDenoiserCallback: target_epsilon={self.epsilon_budget} is spent")
        clipped = self._clipper(inputs)
        multipliers = self.slice_multipliers(inputs, clipped.losses, clipped.norms)
        self.last_multipliers = multipliers
        generator = self.randomness.noise_generator(self.ledger.steps, inputs[0].device)
        stds = {key: multipliers[key] * self.max_grad_norm if self._rank == 0 else 0.0 for key in self._slices}
        noisy = add_slice_noise(clipped.grads, self._slices, stds, generator)
        scale = self._world_size / (self.loaders.sample_rate * self.loaders.num_examples)
        private = {name: grad * scale for name, grad in noisy.items()}
        self.guard.record(private)
        self.ledger.record(self.xi_up, self.loaders.sample_rate)
        params = self._clipper.trainable_parameters()
        return gradient_surrogate(params, private)

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

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "mode": self.mode, "xi_up": self.xi_up}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        for key in ("mode", "xi_up"):
            if state_dict.get(key) != getattr(self, key):
                raise MisconfigurationException(
                    f"TransDenoiserCallback: the checkpoint was trained with {key}={state_dict.get(key)!r}, this run "
                    f"has {key}={getattr(self, key)!r}; resume with the same value so the accounting stays valid"
                )
        super().load_state_dict(state_dict)


def add_slice_noise(
    grads: dict[str, Tensor], slices: dict[str, list[str]], stds: dict[str, float], generator: torch.Generator
) -> dict[str, Tensor]:
    """``grads`` plus independent ``N(0, stds[slice]^2)`` noise on every coordinate of each slice's parameters."""
    noisy = {}
    for key, names in slices.items():
        for name in names:
            grad = grads[name]
            draw = torch.randn(grad.shape, generator=generator, device=grad.device, dtype=grad.dtype)
            noisy[name] = grad + stds[key] * draw
    return noisy


def _all_reduce(tensor: Tensor, op: Any) -> Tensor:
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(tensor, op=op)
    return tensor


__all__ = ["MODES", "TransDenoiserCallback", "add_slice_noise"]
