"""Per-example gradients, clipping and the Gaussian mechanism of DP-SGD (Abadi et al. 2016, arXiv 1607.00133).

The engine computes every example's gradient with ``torch.func`` (``functional_call`` + ``vmap(grad(...))``):
the loss of each example is evaluated on a batch that holds that example alone, so **no loss term can mix two
examples** whatever the model or the loss does. This is a structural guarantee, not a convention: changing
example ``j`` cannot change example ``i``'s gradient.

Why not Opacus' hooks: Opacus 1.6 registers full backward hooks whose outputs are views, and every residual
network with an in-place add (timm and torchvision ResNets, ``x += shortcut``) fails with "Output 0 of
BackwardHookFunction is a view and is being modified inplace" (meta-pytorch/opacus #720, #828). ``vmap`` has no
module hooks, so timm ResNets, our tanh CNN and any functional model work, and an adversarial attack can run on
the model at any time without touching the privacy machinery.

Augmentation groups (docs/design.md, contract 3): an example may carry ``V`` views; the method's loss averages over
them, so the per-example gradient is the mean of the views' gradients *before* clipping and the sensitivity stays
``max_grad_norm``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import dataclass

import torch
from torch import Tensor, nn
from torch.func import functional_call, grad, vmap

ExampleLoss = Callable[..., Tensor]
"""``loss(*batch) -> Tensor[B]``: per-example losses of a batch; called here on batches of one example."""

_NORM_EPS = 1e-6
AUTO_CHUNK_FLOATS = 1 << 26
"""Per-example-gradient floats per chunk when ``max_physical_batch_size`` is not set."""
CLIPPING_RULES = ("flat", "psac", "automatic")


def clip_factors(norms: Tensor, max_grad_norm: float, rule: str = "flat", stability: float = 0.01) -> Tensor:
    """Per-example scale factors ``c_i`` so that ``||c_i g_i|| <= max_grad_norm`` for every example.

    Rules:
        * ``flat``: ``min(1, C / ||g||)`` (Abadi et al. 2016);
        * ``psac``: ``C / (||g|| + r / (||g|| + r))``, per-sample adaptive clipping (Xia et al. 2023, Eq. 7 of
          DP-CERT), which normalizes every gradient and down-weights small ones;
        * ``automatic``: ``C / (||g|| + r)`` (Bu et al. 2023, "automatic clipping").

    Every rule gives a norm strictly below ``C``, so the sensitivity of the sum is ``C`` whichever is used.
    """
    if rule == "flat":
        return (max_grad_norm / (norms + _NORM_EPS)).clamp(max=1.0)
    if rule == "psac":
        return max_grad_norm / (norms + stability / (norms + stability))
    if rule == "automatic":
        return max_grad_norm / (norms + stability)
    raise ValueError(f"clipping must be one of {CLIPPING_RULES}, got {rule!r}")


@dataclass(frozen=True)
class ClippedSum:
    """Result of :func:`clipped_gradient_sum`.

    Attributes:
        grads: ``name -> sum_i clip(g_i)`` for every trainable parameter.
        norms: ``[B]`` per-example gradient norms before clipping.
        losses: ``[B]`` per-example losses.
    """

    grads: dict[str, Tensor]
    norms: Tensor
    losses: Tensor


def stateless_call(module: nn.Module, tensors: Mapping[str, Tensor], args: tuple, kwargs: dict | None = None):
    """``module(*args, **kwargs)`` with ``tensors`` (full name -> tensor) in place of the module's parameters or
    buffers of those names, as ``torch.func.functional_call``, but each slot (an owner module and an attribute name)
    substituted and restored exactly once; a tensor tied to other slots (the same parameter in two modules) is
    substituted in all of them.

    Why not ``functional_call``'s own tying: a module reachable under two paths (CoaT's convolutional position
    encodings, held by the model and by its blocks) is one slot under two names. ``functional_call`` swaps it once per
    name and puts the originals back in the order it swapped them, so the last write back is the substitute: after a
    ``vmap`` the module held a dead functorch tensor instead of its parameter (torch 2.11 to 2.14), and training went
    on without that parameter."""
    slots: dict[int, dict[tuple[int, str], str]] = {}  # tensor id -> one name per slot holding it
    named: dict[str, Tensor] = {}
    for prefix, owner in module.named_modules(remove_duplicate=False):
        for store in (owner._parameters, owner._buffers):
            for attr, tensor in store.items():
                if tensor is not None:
                    name = f"{prefix}.{attr}" if prefix else attr
                    named[name] = tensor
                    slots.setdefault(id(tensor), {}).setdefault((id(owner), attr), name)
    substitutes: dict[str, Tensor] = {}
    for name, value in tensors.items():
        if name not in named:
            raise KeyError(f"{type(module).__name__} has no parameter or buffer named {name!r}")
        for slot_name in slots[id(named[name])].values():
            if substitutes.setdefault(slot_name, value) is not value:
                raise ValueError(f"{name!r} and another name of the same tied tensor were given different tensors")
    return functional_call(module, substitutes, args, kwargs, tie_weights=False, strict=False)


class _LossModule(nn.Module):
    """Exposes ``owner.<method>`` as ``forward`` so ``functional_call`` can substitute the owner's parameters."""

    def __init__(self, owner: nn.Module, method: str) -> None:
        super().__init__()
        self.owner = owner
        self.method = method

    def forward(self, *batch: Tensor) -> Tensor:
        return getattr(self.owner, self.method)(*batch)


class PerExampleClipper:
    """Computes ``sum_i min(1, C / ||g_i||) g_i`` over a batch, where ``g_i`` is example ``i``'s full gradient.

    Args:
        module: the module that owns the parameters and the loss method.
        loss_method: name of ``module``'s method ``loss(*batch) -> Tensor[B]`` of per-example losses.
        max_grad_norm: the clipping bound ``C`` on the flat L2 norm over all trainable parameters.
        max_physical_batch_size: split a batch into chunks of at most this many examples (per-example gradients
            of a chunk take ``chunk * num_params`` floats). ``None``: as many examples as fit in
            ``AUTO_CHUNK_FLOATS`` per-example-gradient floats (256 MB in fp32), which bounds memory and is also
            faster: on a 2-core CPU, timm ``resnet18`` at batch 64 took 23 s unchunked and 3.6 s in chunks of 16.
        clipping: ``"flat"`` (default), ``"psac"`` or ``"automatic"``; see :func:`clip_factors`.
        parameter_names: differentiate only these trainable parameters (default: all); the others are used as
            constants. The per-layer engine (``core/ghost/``) uses this for the parameters it has no rule for.

    Guarantees:
        * Each example's contribution to the returned sum has L2 norm ``<= max_grad_norm``.
        * Example ``i``'s contribution depends only on example ``i`` (and the parameters).
        * Frozen parameters (``requires_grad=False``) and buffers are used but never differentiated.

    Assumptions:
        The loss method computes each example's loss from that example alone when given a batch of one (true of
        any layer without cross-example statistics: BatchNorm in training mode violates it and is refused by
        ``DPCallback``). Randomness inside the loss (dropout) is drawn independently per example.
    """

    unbounded_calls = 0
    """Calls whose sensitivity is unbounded: never any here (each example's loss is computed alone); the ghost
    engine's count of the same name is not always 0."""

    def __init__(
        self,
        module: nn.Module,
        loss_method: str,
        max_grad_norm: float,
        max_physical_batch_size: int | None = None,
        clipping: str = "flat",
        parameter_names: Collection[str] | None = None,
    ) -> None:
        if clipping not in CLIPPING_RULES:
            raise ValueError(f"clipping must be one of {CLIPPING_RULES}, got {clipping!r}")
        if not (max_grad_norm > 0 and torch.isfinite(torch.tensor(max_grad_norm))):
            raise ValueError(f"max_grad_norm must be a positive finite number, got {max_grad_norm}")
        if max_physical_batch_size is not None and max_physical_batch_size < 1:
            raise ValueError(f"max_physical_batch_size must be >= 1 or None, got {max_physical_batch_size}")
        self.module = module
        self.max_grad_norm = float(max_grad_norm)
        self.max_physical_batch_size = max_physical_batch_size
        self.clipping = clipping
        self.parameter_names = None if parameter_names is None else frozenset(parameter_names)
        self._loss_module = _LossModule(module, loss_method)
        self._per_example_grad = vmap(grad(self._example_loss, has_aux=True), in_dims=(None, 0), randomness="different")

    def trainable_parameters(self) -> dict[str, Tensor]:
        return {
            name: p
            for name, p in self.module.named_parameters()
            if p.requires_grad and (self.parameter_names is None or name in self.parameter_names)
        }

    def per_example_gradients(self, batch: tuple[Tensor, ...]) -> tuple[dict[str, Tensor], Tensor]:
        """Unclipped per-example gradients ``name -> [b, *shape]`` and losses ``[b]`` of a (small) batch."""
        params = {name: p.detach() for name, p in self.trainable_parameters().items()}
        return self._gradients(params, batch)

    def _gradients(self, params: dict[str, Tensor], batch: tuple[Tensor, ...]) -> tuple[dict[str, Tensor], Tensor]:
        """Per-example gradients and losses, outside autograd's graph: with ``parameter_names``, the parameters left
        out enter the losses as they are, requiring gradient, and the gradients would otherwise record a graph
        through them (noise could then not be added in place). ``torch.func.grad`` ignores the outer ``no_grad``."""
        with torch.no_grad():
            return self._per_example_grad(params, batch)

    def _example_loss(self, params: Mapping[str, Tensor], example: tuple[Tensor, ...]) -> tuple[Tensor, Tensor]:
        single = tuple(t.unsqueeze(0) for t in example)
        prefixed = {f"owner.{name}": p for name, p in params.items()}
        loss = stateless_call(self._loss_module, prefixed, single).sum()
        return loss, loss.detach()

    def __call__(self, batch: tuple[Tensor, ...]) -> ClippedSum:
        """Clipped per-example gradient sum of ``batch`` (a tuple of tensors sharing the leading batch dim)."""
        params = {name: p.detach() for name, p in self.trainable_parameters().items()}
        size = batch[0].shape[0]
        sums = {name: torch.zeros_like(p) for name, p in params.items()}
        if size == 0:
            empty = batch[0].new_zeros(0)
            return ClippedSum(sums, empty, empty)
        num_params = sum(p.numel() for p in params.values())
        chunk = self.max_physical_batch_size or max(1, AUTO_CHUNK_FLOATS // max(1, num_params))
        norms, losses = [], []
        for start in range(0, size, chunk):
            part = tuple(t[start : start + chunk] for t in batch)
            grads, part_losses = self._gradients(params, part)
            part_norms = per_example_norms(grads)
            factors = clip_factors(part_norms, self.max_grad_norm, self.clipping)
            with float32_products():
                for name, g in grads.items():
                    sums[name] += torch.einsum("b,b...->...", factors, g)
            norms.append(part_norms)
            losses.append(part_losses)
        return ClippedSum(sums, torch.cat(norms), torch.cat(losses))


@contextlib.contextmanager
def tf32_settings(*, cudnn: bool, matmul: bool):
    """TF32 on or off inside the block for cuDNN convolutions (``cudnn``) and CUDA matrix products (``matmul``); the
    caller's settings restored after, also when the block raises."""
    previous = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = cudnn, matmul
    try:
        yield
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = previous


def float32_products():
    """TF32 (cuDNN convolutions, CUDA matrix products) off inside the block, restored after. A product that weights
    per-example gradients by their clip factors must not round them: TF32 keeps 10 mantissa bits, so a share could
    exceed the clip by about 0.05 % (``torch.backends.cuda.matmul.allow_tf32`` is off by default, but a caller may
    turn it on)."""
    return tf32_settings(cudnn=False, matmul=False)


def per_example_norms(grads: Mapping[str, Tensor]) -> Tensor:
    """Flat L2 norm over all parameters of each example's gradient: ``[B]`` from ``name -> [B, *shape]``."""
    norms = [torch.linalg.vector_norm(g.reshape(g.shape[0], -1), dim=1) for g in grads.values()]
    return torch.linalg.vector_norm(torch.stack(norms, dim=0), dim=0)


NOISE_DRAW_VALUES = 1 << 22
"""Gaussian noise is drawn for consecutive gradients of one device and dtype in one call, at most this many values
per call (a larger gradient alone): one random-number kernel for many parameter tensors, not one each, and the
noisy sum is formed by multi-tensor (``torch._foreach_*``) adds and products. Per-parameter draws cost a GPU three
kernel launches per parameter tensor (186 of a ResNet-18 step's 996 on an H100, where the private step waited on
launches); the bound keeps the drawn buffer at 16 MB in float32."""


def _draw_groups(tensors: list[Tensor]) -> Iterator[list[Tensor]]:
    """Consecutive runs of ``tensors`` on one device with one dtype, each of at most :data:`NOISE_DRAW_VALUES`
    values (or one tensor)."""
    group: list[Tensor] = []
    values = 0
    for t in tensors:
        if group and (
            values + t.numel() > NOISE_DRAW_VALUES or t.device != group[0].device or t.dtype != group[0].dtype
        ):
            yield group
            group, values = [], 0
        group.append(t)
        values += t.numel()
    if group:
        yield group


def _drawn_noise(group: list[Tensor], std: float, generator: torch.Generator | None) -> list[Tensor]:
    """``N(0, std^2)`` noise shaped like each tensor of ``group``: views of one draw from ``generator``."""
    sizes = [t.numel() for t in group]
    flat = torch.normal(0.0, std, size=(sum(sizes),), generator=generator, device=group[0].device, dtype=group[0].dtype)
    return [piece.view(t.shape) for piece, t in zip(flat.split(sizes), group, strict=True)]


def gaussian_noise_like(
    grads: Mapping[str, Tensor], std: float, generator: torch.Generator | None = None
) -> dict[str, Tensor]:
    """Independent ``N(0, std^2)`` noise with the shape of each gradient (the Gaussian mechanism); zeros when
    ``std`` is 0. The draws are grouped as :data:`NOISE_DRAW_VALUES` says, in the order of ``grads``."""
    if std <= 0:
        return {name: torch.zeros_like(g) for name, g in grads.items()}
    groups = _draw_groups(list(grads.values()))
    return dict(zip(grads, (n for group in groups for n in _drawn_noise(group, std, generator)), strict=True))


def add_noise_and_scale_(
    grads: Mapping[str, Tensor], std: float, scale: float, generator: torch.Generator | None = None
) -> Mapping[str, Tensor]:
    """The private release of a clipped gradient sum, in place: ``g <- (g + N(0, std^2 I)) * scale`` for every
    gradient of ``grads``, with ``std = sigma C`` (noise multiplier ``sigma``, clipping bound ``C``); returns ``grads``.

    Every DP-SGD release of the library goes through this function: ``DPCallback``'s step, ``TransDenoiserCallback``'s
    step (once per parameter slice, each at its own ``sigma``) and each private component's update of
    ``GenerativeDPModule`` (IGAMT, the EHR baselines), so a fix to the release lands once.

    Guarantee: when adding or removing one example moves ``grads`` by at most ``C`` in L2 (each example's gradient
    clipped to ``C`` and no term mixing examples; docs/design.md, contracts 3 and 11), the noisy sum is the Gaussian
    mechanism at noise multiplier ``sigma = std / C``. On a Poisson sample of rate ``q`` it is the subsampled Gaussian
    mechanism that the caller's ledger records as ``(sigma, q)`` (:mod:`lightning_dprobust.core.accounting`); the
    product by ``scale`` (``1 / (q N)`` for the expected batch) is post-processing.

    Assumptions: ``generator`` is the mechanism's own secret generator for this release
    (``DPRandomness.noise_generator``: operating-system entropy, a fresh stream per release, never the global RNG;
    docs/design.md, contract 8); ``None`` (the global RNG) is for benchmarks only. ``std = 0`` adds no noise and draws
    nothing: no guarantee, unless the sum is all-reduced into another rank's noisy sum (``DPCallback`` under DDP).

    The draws are those of :func:`gaussian_noise_like` with the same generator (same calls, same order), but only one
    group's noise (at most :data:`NOISE_DRAW_VALUES` values, or one gradient) exists at a time.
    """
    tensors = list(grads.values())
    if std > 0:
        for group in _draw_groups(tensors):
            torch._foreach_add_(group, _drawn_noise(group, std, generator))
    if tensors:
        torch._foreach_mul_(tensors, scale)
    return grads
