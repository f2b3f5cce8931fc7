"""Shared DP wiring of multi-component generative models (GAN, VAE, VAE-GAN, AAE, DAAE, IGAMT, ...).

A generative model here is a set of **components** (encoder, decoder, generator, critics, ...), each a disjoint set
of parameters with its own optimizer, trained by manual optimization. A component is **private** when its gradient
reads the real training data, directly or through a component that is itself trained without noise; the others
(typically the generator, updated only through critics that are private) read nothing but public state and
synthetic draws, so their updates are post-processing.

Every update of a private component is one DP-SGD release (Abadi et al. 2016, arXiv 1607.00133):

1. the batch is a Poisson sample of rate ``q`` (``core/sampling.py``, through the loader factory ``DPCallback`` uses);
2. each example's gradient of the component's per-example loss is clipped to ``max_grad_norm`` ``C`` by the shared
   engine (``core/per_sample.py`` ``PerExampleClipper(..., parameter_names=...)``), summed, and summed over ranks;
3. ``N(0, (noise_multiplier * C)^2)`` is added once to the sum, from a generator seeded by the secret randomness of
   ``callbacks/dp_randomness.py`` (never the global RNG), the same on every rank so replicas stay identical;
4. the result is divided by the expected global batch size ``q N`` and applied by the component's optimizer.

Steps 3 and 4 are ``DPCallback``'s release, :func:`~lightning_dprobust.core.per_sample.add_noise_and_scale_`.

Accounting: the ``K`` private releases of one training iteration read the same Poisson sample; their composition is
``sqrt(sum_k mu_k^2)``-GDP with ``mu_k = 1 / noise_multiplier`` (Dong, Roth, Su 2019, Cor. 3.3: Gaussian mechanisms
compose exactly and adaptively), i.e. one subsampled Gaussian mechanism with noise multiplier
``noise_multiplier / sqrt(K)``. Each iteration records that one event in the module's :attr:`ledger`, which is
checkpointed, so a resumed run reports the epsilon of an unbroken one.

``clip_mode="batch"`` reproduces the thesis and its code (pyvacy with one micro-batch): the batch-mean gradient is
clipped to ``C`` and ``N(0, (noise_multiplier C)^2)`` is added. One example then moves the clipped mean by up to
``2 C``, so no DP guarantee follows; the epsilon the thesis would claim (the accountant at ``noise_multiplier``, one
event per iteration) is recorded as **nominal** (``privacy/nominal_epsilon``), never as a guarantee. A subclass
whose choice of private components leaves a leak says so through :meth:`nominal_reason` and gets the same
treatment.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import Any

import lightning as L
import torch
import torch.distributed as dist
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from torch import Tensor, nn

from lightning_dprobust.callbacks.dp_arguments import check_choice, check_mechanism, check_number
from lightning_dprobust.callbacks.dp_checks import check_trainer
from lightning_dprobust.callbacks.dp_guard import BufferWatch, PrivateStepBypassed, PrivateStepGuard
from lightning_dprobust.callbacks.dp_loader import PoissonLoaderFactory
from lightning_dprobust.callbacks.dp_planning import resolve_delta
from lightning_dprobust.callbacks.dp_randomness import DPRandomness
from lightning_dprobust.core.accounting import DEFAULT_ACCOUNTANT, DeltaAndAccountant, PrivacyLedger, epsilon_for
from lightning_dprobust.core.engines import build_clipper
from lightning_dprobust.core.ghost import GhostClipper
from lightning_dprobust.core.per_sample import PerExampleClipper, add_noise_and_scale_
from lightning_dprobust.methods.base import renamed_seed

CLIP_MODES = ("per_example", "batch")
NOMINAL_SOURCE = "generative.nominal_accounting"
NOMINAL_WARNING = "nominal: NOT a differential-privacy guarantee"


class GenerativeDPModule(L.LightningModule, DeltaAndAccountant):
    """Base of generative LightningModules with one optimizer per component and DP on the private ones.

    Subclasses define :meth:`component_modules` (name -> modules, disjoint, covering every trainable parameter),
    :meth:`private_components` and :meth:`learning_rates`, and call :meth:`component_step` in ``training_step``.

    Args:
        noise_multiplier: ``sigma``; the noise std is ``sigma * max_grad_norm``. ``None``: no DP at all (no Poisson
            sampling, no clipping, no noise; epsilon is infinite). ``0``: clipping only (warned, epsilon infinite).
        max_grad_norm: the clipping bound ``C``.
        clip_mode: ``"per_example"`` (DP-SGD, the default) or ``"batch"`` (the thesis; nominal epsilon only).
        delta: the delta of the guarantee; default ``1 / (10 n)`` rounded down to a power of ten.
        accountant: ``"pld"`` (default, as ``DPCallback``), ``"rdp"``, ``"prv"`` or ``"gdp"`` (``core/accounting.py``).
        sample_rate: Poisson inclusion probability; default ``batch_size * world_size / n``.
        seed: fix the masks and the noise (reproducibility mode, warned); ``None`` draws a secret root per fit.
            ``dp_seed`` is its deprecated name (warned once; saved hyperparameters hold ``seed`` only).
        max_physical_batch_size: per-example gradient chunk size (memory bound).
        lr_decay: the factor of each component's exponential learning-rate decay per epoch.
        engine: per-example clipping engine of each private component's loss: ``"vmap"`` (default), ``"auto"`` or
            ``"ghost"`` (:mod:`lightning_dprobust.core.engines`); the choice is logged once per (component, loss).
            Same guarantee either way, for losses that never mix examples (``ghost`` checks that at its first call
            and every 100 calls, :mod:`lightning_dprobust.core.engines`). ``vmap`` is the default because it is the
            faster one at the sizes this library ships (IGAMT at ``configs/igamt/synthetic.yaml``'s sizes, CPU:
            docs/performance.md, "Generative methods"): the per-layer rules pay hooks and graph walks that a 32-wide
            transformer does not repay.
    """

    def __init__(
        self,
        noise_multiplier: float | None = 1.0,
        max_grad_norm: float = 1.0,
        clip_mode: str = "per_example",
        delta: float | None = None,
        accountant: str = DEFAULT_ACCOUNTANT,
        sample_rate: float | None = None,
        seed: int | None = None,
        max_physical_batch_size: int | None = None,
        lr_decay: float = 0.99,
        engine: str = "vmap",
        dp_seed: int | None = None,
    ) -> None:
        super().__init__()
        seed = renamed_seed(type(self).__name__, "dp_seed", dp_seed, seed)
        self.seed = seed
        _validate(type(self).__name__, noise_multiplier, max_grad_norm, clip_mode, accountant, lr_decay, engine)
        self.engine = engine
        self.automatic_optimization = False
        self.noise_multiplier = noise_multiplier
        self.max_grad_norm = float(max_grad_norm)
        self.clip_mode = clip_mode
        self.delta = delta
        self.accountant = accountant
        self.max_physical_batch_size = max_physical_batch_size
        self.lr_decay = lr_decay
        self.ledger = PrivacyLedger()
        self._nominal_ledger = PrivacyLedger()
        self._zero_noise_steps = 0
        self._releases = 0
        self.randomness = DPRandomness(seed)
        self.loaders = PoissonLoaderFactory(sample_rate, self.randomness.mask_seed, poisson=True)
        self._clippers: dict[tuple[str, str], PerExampleClipper | GhostClipper] = {}
        self._raw_optimizers: list[torch.optim.Optimizer] | None = None
        self._guard = PrivateStepGuard()  # DPCallback's guard: one private release, applied unchanged
        self._guarded: str | None = None  # the private component whose release the guard holds
        self._buffer_watch = BufferWatch()

    def save_hyperparameters(self, *args: Any, frame: Any = None, **kwargs: Any) -> None:
        """Lightning's, from the subclass's ``__init__`` frame, with the DP seed under its one name ``seed`` whichever
        name it was given (``dp_seed`` is deprecated), so a saved checkpoint reloads without the old name."""
        super().save_hyperparameters(*args, frame=frame or inspect.currentframe().f_back, **kwargs)
        if "dp_seed" in self.hparams:
            self.hparams.pop("dp_seed")
            self.hparams["seed"] = self.seed

    # ------------------------------------------------------------------------------------------- subclass API
    def component_modules(self) -> Mapping[str, Sequence[nn.Module]]:
        """``name -> modules`` of each component, in optimizer order; parameters may appear in one component only."""
        raise NotImplementedError

    def private_components(self) -> frozenset[str]:
        """The components whose gradient reads real data (directly or through an un-noised component)."""
        raise NotImplementedError

    def learning_rates(self) -> Mapping[str, float]:
        """``name -> learning rate`` of each component's Adam optimizer."""
        raise NotImplementedError

    def nominal_reason(self) -> str | None:
        """Why this configuration's epsilon is not a guarantee, or ``None`` when it is."""
        if self.clip_mode == "batch":
            return "clip_mode='batch' clips the batch-mean gradient, so one example's influence is not bounded by C"
        return None

    @property
    def dp_enabled(self) -> bool:
        return self.noise_multiplier is not None

    # ------------------------------------------------------------------------------------------- components
    def component_parameters(self) -> dict[str, dict[str, nn.Parameter]]:
        """``component -> {parameter name in this module: parameter}``; checks disjointness and coverage."""
        names = {id(p): name for name, p in self.named_parameters() if p.requires_grad}
        owned: dict[str, dict[str, nn.Parameter]] = {}
        seen: dict[str, str] = {}
        for component, modules in self.component_modules().items():
            params = {names[id(p)]: p for module in modules for p in module.parameters() if p.requires_grad}
            for name in params:
                if name in seen:
                    raise ValueError(f"parameter {name} belongs to both components {seen[name]!r} and {component!r}")
                seen[name] = component
            owned[component] = params
        missing = sorted(set(names.values()) - set(seen))
        if missing:
            raise ValueError(f"parameters {missing[:5]} belong to no component: every trainable one needs an owner")
        return owned

    def configure_optimizers(self) -> list[torch.optim.Optimizer]:
        """One Adam per component (``learning_rates``), in :meth:`component_modules` order."""
        rates, private = self.learning_rates(), self.private_components() if self.dp_enabled else frozenset()
        optimizers = []
        for name, params in self.component_parameters().items():
            optimizer = torch.optim.Adam(list(params.values()), lr=rates[name], betas=(0.5, 0.9))
            if name in private:
                optimizer.register_step_pre_hook(partial(self._verify_private_step, name))
            optimizers.append(optimizer)
        self._raw_optimizers = optimizers
        return optimizers

    def _verify_private_step(self, component: str, optimizer: torch.optim.Optimizer, *_: Any) -> None:
        """Contract 10, with ``DPCallback``'s guard: a private component's optimizer applies exactly the release
        :meth:`component_step` made for it, to no tensor but the component's, and no buffer changed since the batch
        started. Runs as the optimizer's step pre-hook: under manual optimization the gradient is in place by then,
        and nothing runs between the hook and the update."""
        guarded, self._guarded = self._guarded, None
        try:
            if guarded != component:
                raise PrivateStepBypassed("no release of this component is pending")
            self._buffer_watch.verify()
            self._guard.verify_optimizer(optimizer, self.component_parameters()[component])
        except PrivateStepBypassed as error:
            self._guard.reset()
            raise PrivateStepBypassed(
                f"the optimizer of the private component {component!r} was about to apply a gradient that "
                f"component_step did not produce ({error}); update private components only through component_step"
            ) from error

    def _optimizer(self, component: str) -> Any:
        index = list(self.component_modules()).index(component)
        if self._trainer is not None:
            return self.optimizers()[index]
        if self._raw_optimizers is None:
            self.configure_optimizers()
        return self._raw_optimizers[index]

    # ------------------------------------------------------------------------------------------- the step
    def component_step(
        self, component: str, loss: Callable[..., Tensor] | str, batch: tuple[Tensor, ...] = ()
    ) -> Tensor:
        """Update ``component`` once; returns the detached mean loss.

        ``loss``: for a private component, the name of a method ``loss(*batch) -> Tensor[B]`` of per-example losses,
        each computed from example ``i`` of every tensor in ``batch`` alone (synthetic draws paired with real
        examples belong to ``batch``); for a public one, a callable ``loss() -> Tensor`` (scalar) or such a name.
        """
        params = self.component_parameters()[component]
        if component in self.private_components():
            loss_fn = getattr(self, loss) if isinstance(loss, str) else None
            if loss_fn is None:
                raise TypeError(f"the private component {component!r} needs the name of a per-example loss method")
            grads, value = self._private_gradients(component, loss, params, batch)
        else:
            value = (getattr(self, loss)(*batch) if isinstance(loss, str) else loss()).mean()
            grads = _all_reduce(_gradients(value, params), mean=True)
        optimizer = self._optimizer(component)
        for name, p in params.items():
            p.grad = grads[name]
        if component in self.private_components():
            self._guard.reset()
            self._guard.record(grads)
            self._guarded = component
        optimizer.step()
        self._guarded = None
        optimizer.zero_grad(set_to_none=True)
        return value.detach()

    def _private_gradients(
        self, component: str, loss: str, params: dict[str, nn.Parameter], batch: tuple[Tensor, ...]
    ) -> tuple[dict[str, Tensor], Tensor]:
        if not self.dp_enabled:
            losses = getattr(self, loss)(*batch)
            total = _all_reduce(_gradients(losses.sum(), params), mean=False)
            size = _all_reduce({"n": torch.tensor(float(len(losses)))}, mean=False)["n"].clamp(min=1)
            return {name: g / size for name, g in total.items()}, losses.detach().mean()
        if self.clip_mode == "batch":
            losses = getattr(self, loss)(*batch)
            mean = _all_reduce(_gradients(losses.mean(), params), mean=True)
            grads, scale = _clip_total(mean, self.max_grad_norm), 1.0
        else:
            clipper = self._clippers.get((component, loss)) or self._build_clipper(component, loss, params)
            clipped = clipper(batch)
            grads, losses = _all_reduce(clipped.grads, mean=False), clipped.losses
            scale = 1.0 / (self.loaders.sample_rate * self.loaders.num_examples)
        generator = self._noise_generator(grads)
        self._releases += 1
        private = add_noise_and_scale_(grads, self.noise_multiplier * self.max_grad_norm, scale, generator)
        return dict(private), losses.detach().mean()

    def _build_clipper(
        self, component: str, loss: str, params: Mapping[str, Tensor]
    ) -> PerExampleClipper | GhostClipper:
        clipper, choice = build_clipper(
            self.engine, self, loss, self.max_grad_norm, self.max_physical_batch_size, parameter_names=tuple(params)
        )
        rank_zero_info(f"{type(self).__name__}: per-example clipping engine of {component} / {loss}: {choice}")
        self._clippers[component, loss] = clipper
        return clipper

    def _noise_generator(self, grads: Mapping[str, Tensor]) -> torch.Generator:
        """The secret generator of this release (the same on every rank, so replicas add the same noise)."""
        counter = self.ledger.steps + self._nominal_ledger.steps + self._zero_noise_steps
        device = next(iter(grads.values())).device
        return self.randomness.noise_generator(_release_key(counter, self._releases), device)

    # ------------------------------------------------------------------------------------------- accounting
    def record_iteration(self) -> None:
        """Account the private releases of this iteration: one event at ``sigma / sqrt(K)`` (see module doc)."""
        releases, self._releases = self._releases, 0
        if not (self.dp_enabled and releases):
            return
        if self.noise_multiplier == 0:
            self._zero_noise_steps += 1
            return
        if self.nominal_reason() is None:
            self.ledger.record(self.noise_multiplier / math.sqrt(releases), self.loaders.sample_rate)
        else:  # the thesis's claim: one Gaussian mechanism at noise_multiplier per iteration
            self._nominal_ledger.record(self.noise_multiplier, self.loaders.sample_rate)

    def epsilon(self, delta: float | None = None) -> float:
        """Epsilon of the guarantee so far (``inf`` without DP, after a noiseless step, or when only nominal)."""
        if not self.dp_enabled or self._zero_noise_steps or self.nominal_reason() is not None:
            return math.inf
        return self.ledger.epsilon(delta or self.delta, self.accountant) if self.ledger.steps else 0.0

    def nominal_epsilon(self, delta: float | None = None) -> float:
        """What the thesis would report for this run (the accountant on the nominal events); not a guarantee."""
        return epsilon_for(self._nominal_ledger.history, delta or self.delta, self.accountant)

    # ------------------------------------------------------------------------------------------- lifecycle
    def setup(self, stage: str) -> None:
        if stage != "fit" or not self.dp_enabled:
            return
        check_trainer(self.trainer, poisson_sampling=True)
        self.component_parameters()  # refuse overlapping or unowned parameters before anything trains
        self.randomness.next_fit()
        self.loaders.attach(self.trainer, self)
        reason = self.nominal_reason()
        if reason:
            rank_zero_warn(f"{type(self).__name__}: {reason}; its epsilon is {NOMINAL_WARNING}")

    def on_fit_start(self) -> None:
        if self.dp_enabled:
            self.randomness.start(self.trainer)

    def on_train_start(self) -> None:
        if not self.dp_enabled:
            return
        self.loaders.check_train_loader(self.trainer.train_dataloader, self.trainer.world_size)
        self.delta = resolve_delta(self.delta, self.loaders.num_examples, type(self).__name__)
        rank_zero_info(
            f"{type(self).__name__}: private components {sorted(self.private_components())}, noise_multiplier="
            f"{self.noise_multiplier}, max_grad_norm={self.max_grad_norm}, clip_mode={self.clip_mode}, "
            f"sample_rate={self.loaders.sample_rate:.5f}, delta={self.delta:g}"
        )

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        self._buffer_watch.snapshot(self)

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.record_iteration()

    def on_train_epoch_end(self) -> None:
        for optimizer in self._all_optimizers():
            for group in optimizer.param_groups:
                group["lr"] *= self.lr_decay
        if not self.dp_enabled:
            return
        if self.nominal_reason() is None:
            self.log("privacy/epsilon", self.epsilon(), rank_zero_only=True)
        else:
            self.ledger.record_nominal(NOMINAL_SOURCE, self.nominal_epsilon(), self.delta)
            self.log("privacy/nominal_epsilon", self.nominal_epsilon(), rank_zero_only=True)

    def _all_optimizers(self) -> list[Any]:
        optimizers = self.optimizers() if self._trainer is not None else self._raw_optimizers or []
        return list(optimizers) if isinstance(optimizers, list | tuple) else [optimizers]

    def on_fit_end(self) -> None:
        rank_zero_info(f"{type(self).__name__}: {self.privacy_summary()}")

    def privacy_summary(self) -> str:
        """One line: epsilon at delta with the accountant and steps, or why there is none."""
        if not self.dp_enabled:
            return "no DP (epsilon = inf)"
        if self.nominal_reason() is not None:
            return (
                f"epsilon = inf as a guarantee; nominal epsilon {self.nominal_epsilon():.4g} at delta {self.delta:g} "
                f"({NOMINAL_WARNING}: {self.nominal_reason()})"
            )
        return f"epsilon {self.epsilon():.4g} at delta {self.delta:g} ({self.accountant}), {self.ledger.steps} steps"

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint["privacy_ledger"] = self.ledger.state_dict()
        checkpoint["nominal_ledger"] = self._nominal_ledger.state_dict()
        checkpoint["privacy_extra"] = {"zero_noise_steps": self._zero_noise_steps, "delta": self.delta}
        checkpoint["dp_randomness"] = self.randomness.state_dict()

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        if "privacy_ledger" in checkpoint:
            self.ledger.load_state_dict(checkpoint["privacy_ledger"])
            self._nominal_ledger.load_state_dict(checkpoint["nominal_ledger"])
            self._zero_noise_steps = int(checkpoint["privacy_extra"]["zero_noise_steps"])
            self.delta = checkpoint["privacy_extra"]["delta"]
            self.randomness.load_state_dict(checkpoint.get("dp_randomness", {}))


def _release_key(counter: int, release: int) -> int:
    """A distinct noise-stream index for release ``release`` of the iteration after ``counter`` accounted ones."""
    return counter * 1024 + release


def _gradients(value: Tensor, params: Mapping[str, nn.Parameter]) -> dict[str, Tensor]:
    grads = torch.autograd.grad(value, list(params.values()), allow_unused=True, retain_graph=True)
    return {name: torch.zeros_like(p) if g is None else g for (name, p), g in zip(params.items(), grads, strict=True)}


def _clip_total(grads: Mapping[str, Tensor], bound: float) -> dict[str, Tensor]:
    norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads.values()]))
    factor = (bound / (norm + 1e-6)).clamp(max=1.0)
    return {name: g * factor for name, g in grads.items()}


def _all_reduce(grads: dict[str, Tensor], mean: bool) -> dict[str, Tensor]:
    """Sum (or average) over data-parallel ranks; identity in a single process."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return grads
    out = {}
    for name, g in grads.items():
        g = g.detach().clone()
        dist.all_reduce(g, op=dist.ReduceOp.SUM)
        out[name] = g / dist.get_world_size() if mean else g
    return out


def _validate(owner, noise_multiplier, max_grad_norm, clip_mode, accountant, lr_decay, engine) -> None:
    check_mechanism(owner, max_grad_norm, noise_multiplier, accountant, engine)
    check_choice(owner, "clip_mode", clip_mode, CLIP_MODES)
    check_number(owner, "lr_decay", lr_decay, allow_none=False)
    if lr_decay > 1:
        raise MisconfigurationException(f"{owner}(lr_decay={lr_decay!r}) must lie in (0, 1]")
    if noise_multiplier == 0:
        rank_zero_warn(f"{owner}(noise_multiplier=0): clipping only, NO privacy guarantee (epsilon = inf)")
