"""Per-layer rules for per-example gradient norms and clipped sums from activations and output gradients.

For a linear map ``y_t = W a_t + b`` applied at positions ``t = 1..T`` of one example, the example's gradient is
``G^T A`` (``A``: ``[T, d]`` inputs, ``G``: ``[T, p]`` output gradients), and its squared norm can be computed
two ways (Li et al. 2022, "Large Language Models Can Be Strong Differentially Private Learners", arXiv 2110.05679;
Bu et al. 2023, "Differentially Private Optimization on Large Model at Small Cost", ICML, arXiv 2210.00038):

* **ghost norm**: ``||G^T A||^2 = <A A^T, G G^T>``, cost ``~2 T^2 (d + p)``, memory ``T^2`` per example;
* **materialized**: form ``G^T A`` (cost ``~2 T d p``, memory ``d p``) and take its norm.

:class:`LinearRule` picks the cheaper one per layer from the shapes (the "mixed" rule of Bu et al. 2023). The
clipped sum ``sum_i c_i G_i^T A_i`` is one matrix product with output gradients scaled by ``c_i``, the
book-keeping trick of Bu et al. 2023 (no second backward pass).

Augmentation groups: a layer sees ``N = B k`` rows, example ``i`` owning the ``k`` consecutive rows
``[i k, (i + 1) k)`` (its views, flattened as ``views.flatten(0, 1)`` does). The example's gradient is the sum over
its rows, which equals one example with ``k T`` positions, so the rules reshape ``[N, T, .]`` to ``[B, k T, .]``.
Several calls of one layer in a forward (weight sharing) are concatenated along positions the same way.

Convolutions (``core/ghost/conv.py``) and GroupNorm / LayerNorm (``core/ghost/norms.py``) specialize these rules.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Iterable, Set
from dataclasses import dataclass, field
from functools import cached_property
from itertools import combinations
from typing import NamedTuple

import torch
from torch import Tensor, nn
from torch.autograd.graph import get_gradient_edge
from torch.func import vjp, vmap
from torch.nn.parameter import is_lazy

from lightning_dprobust.core.ghost.graph import sequence_marker
from lightning_dprobust.core.ghost.registry import register_rule
from lightning_dprobust.core.per_sample import stateless_call


class Hook(NamedTuple):
    """A forward hook (registered ``with_kwargs``) that captures part of a layer call."""

    module: nn.Module
    pre: bool
    """A forward pre-hook (it sees the call's inputs), else a forward hook (it sees the output too)."""
    hook: Callable[..., None]
    first: bool = True
    """Registered before the module's other hooks of its kind (``prepend``): it sees the inputs the caller passed and
    the output the module computed, before a user's hook replaces them (a hook that returns a new output would
    otherwise hand the rule the gradient at that output, not at the layer's). Call markers (:meth:`start_call`) are
    registered after them, so that what a user's pre-hook computes lies outside the call."""


@dataclass
class Capture:
    """One call of a layer: its input (or the tensor a rule differentiates at), the output edge and its gradient.

    ``shape`` is the shape the rule reads the output gradient in: the output's, or a view of it (a ``nn.Conv1d``'s
    as maps of height 1). ``start`` is an autograd sequence number taken just before the call
    (``core/ghost/graph.py``): the nodes the call created are those numbered in ``(start, edge.node's number]``. A
    streamed call (:meth:`LayerRule.stream`) drops its input once its per-example gradients are formed and never
    holds its output gradient.
    """

    inputs: Tensor | None
    version: int
    edge: object
    shape: torch.Size
    start: int = -1
    grad: Tensor | None = None
    others: tuple[tuple, dict] = ((), {})
    """The call's other positional and keyword arguments, and ``output`` its output, for a rule that re-runs a module
    that takes several (:class:`CompositeRule`)."""
    output: Tensor | None = None
    part: str = ""
    """Which of a rule's capture points the call is, for a rule with several (CaiT's tokens)."""

    def check_unchanged(self) -> None:
        """Refuse an input modified in place after the layer used it (the captured activations would be stale)."""
        if self.inputs._version != self.version:
            raise RuntimeError(
                "a layer's input was modified in place after the layer used it, so the captured activations are "
                "stale: make the model out-of-place (models.make_dp_compatible) or use engine='vmap'"
            )


def output_edge(differentiated: Tensor) -> tuple[object, torch.Size]:
    """The gradient edge of a layer's output as it is now (an in-place op later gives the tensor a new one), and its
    shape."""
    if not differentiated.requires_grad:
        raise RuntimeError("the ghost engine needs gradients enabled in the forward pass of the per-example loss")
    return get_gradient_edge(differentiated), differentiated.shape


class UnsupportedCall(RuntimeError):
    """A layer call a rule cannot capture (a tuple returned, an unbatched image): raised during the forward, it
    sends the rule's parameters to the vmap engine (``GhostClipper``), which sets ``rule``."""

    rule: object = None


def one_tensor_call(mod: nn.Module, args: tuple, kwargs: dict, out: object) -> Tensor:
    """The input of a call that took one tensor and returned one, or :class:`UnsupportedCall`."""
    if kwargs or len(args) != 1 or not isinstance(args[0], Tensor) or not isinstance(out, Tensor):
        raise UnsupportedCall(
            f"{type(mod).__name__} was called with {len(args)} positional and {len(kwargs)} keyword arguments "
            "or returned a non-tensor: the ghost engine needs one tensor in and one out; use engine='vmap'"
        )
    return args[0]


def runs_forward_of(module: nn.Module, base: type[nn.Module]) -> bool:
    """Whether ``module`` is a ``base`` that computes what ``base`` computes: its class keeps ``base``'s ``forward``
    (and a convolution's ``_conv_forward``). A subclass may not (timm's ``StdConv2d`` standardizes its weight,
    ``Conv2dSame`` pads its input, a weight-dropout layer masks its weight in training mode only), and a closed-form
    rule would then compute another layer's gradients; such a module gets the generic rule. Classes read to compute
    ``base``'s map with a forward of their own are accepted by exact type (:func:`_same_map_as`)."""
    kind = type(module)
    if kind in _same_map_as(base):
        return True
    return (
        isinstance(module, base)
        and kind.forward is base.forward
        and getattr(kind, "_conv_forward", None) is getattr(base, "_conv_forward", None)
    )


def _same_map_as(base: type[nn.Module]) -> tuple[type, ...]:
    """Classes whose own ``forward`` computes ``base``'s map: timm's ``Linear`` (MobileNetV3's classifier), which is
    ``F.linear(input, weight, bias)`` outside TorchScript."""
    from timm.layers import Linear

    return (Linear,) if base is nn.Linear else ()


def squared_norms(per_example: Tensor) -> Tensor:
    """``[B, ...] -> [B]``: each example's squared L2 norm, without a squared copy of ``per_example`` (nor a
    contiguous one: a permuted view is reduced in place)."""
    rows = per_example if per_example.dim() > 1 else per_example.unsqueeze(1)  # a scalar parameter's: [B] -> [B, 1]
    return torch.linalg.vector_norm(rows, dim=tuple(range(1, rows.dim()))).square()


def memory_order(t: Tensor) -> tuple[list[int], list[int]]:
    """A permutation of ``t``'s dims that keeps the first and puts the others outermost in memory first, and its
    inverse: ``t.permute(order)`` is contiguous when ``t`` is a permuted view of a contiguous tensor (as the
    convolution's batched products return)."""
    order = [0, *sorted(range(1, t.dim()), key=lambda dim: -t.stride(dim))]
    return order, [order.index(dim) for dim in range(t.dim())]


def example_rows(per_example: dict[str, Tensor], examples: int) -> Tensor:
    """``[B, P]``: every per-example gradient ``[B, *shape]`` flattened, side by side in the dict's order, so that
    their norms and their weighted sum are one reduction and one vector-matrix product for all of them, not a few
    kernels per parameter tensor (kernel launches were what a GPU step waited on). Permuted views are copied once."""
    return torch.cat([g.reshape(examples, -1) for g in per_example.values()], dim=1)


def split_rows(total: Tensor, per_example: dict[str, Tensor]) -> dict[str, Tensor]:
    """``[P]`` (e.g. a weighted sum of :func:`example_rows`) -> ``name -> [*shape]`` views, in each gradient's dtype."""
    pieces = total.split([math.prod(g.shape[1:]) for g in per_example.values()])
    return {
        name: piece.view(g.shape[1:]).to(g.dtype) for (name, g), piece in zip(per_example.items(), pieces, strict=True)
    }


def group_rows(t: Tensor, examples: int) -> Tensor:
    """``[N, ...] -> [B, N / B, ...]``: the rows of each example (consecutive), or a clear error."""
    if examples == 0 or t.shape[0] % examples:
        raise RuntimeError(
            f"a layer saw {t.shape[0]} rows for {examples} examples: the per-example loss must pass example i's "
            "views as consecutive rows (views.flatten(0, 1)); use DPCallback(engine='vmap') for other layouts"
        )
    return t.reshape(examples, t.shape[0] // examples, *t.shape[1:])


def _added(total: dict[str, Tensor], grads: dict[str, Tensor]) -> dict[str, Tensor]:
    """``total`` plus one call's per-example gradients; a call may cover only some of the rule's parameters (a CrossViT
    branch's tokens), so the parameters of either dict are kept."""
    return total | {k: total[k] + v if k in total else v for k, v in grads.items()}


@dataclass
class LayerRule:
    """Base: a module, the full names of the parameters it covers, and the calls captured in one forward."""

    module: nn.Module
    names: dict[str, str]
    calls: list[Capture] = field(default_factory=list)
    start: int = -1
    streamed: dict[str, Tensor] | None = None
    _cache = None
    """What a rule keeps from :meth:`sq_norms` to :meth:`clipped_sum` (rules that keep no per-example gradients)."""

    @classmethod
    def applies(cls, module: nn.Module, names: Collection[str]) -> bool:
        """Whether this rule covers ``module``'s trainable parameters ``names`` (local names), which the registry
        (``core/ghost/registry.py``) asks of a registered rule. By default: the layer's own ``weight`` / ``bias``
        (not, e.g., the ``weight_g`` and ``weight_v`` of ``nn.utils.weight_norm``, whose hook forms the weight), on
        a module :meth:`supports`."""
        return set(names) <= {"weight", "bias"} and cls.supports(module)

    @staticmethod
    def supports(module: nn.Module) -> bool:
        return True

    @staticmethod
    def refuses(module: nn.Module) -> bool:
        """Whether no rule may take ``module`` (the vmap engine runs it), though this rule does not apply to it."""
        return False

    def tensors(self) -> dict[str, Tensor]:
        """Local parameter name -> parameter, for the trainable parameters this rule covers (a local name may lead
        into a sub-module: a composite rule re-run for an uncalled sub-module's parameters)."""
        module = self.module
        return {local: module.get_parameter(local) if "." in local else getattr(module, local) for local in self.names}

    @property
    def path(self) -> str:
        """The module's name in the model the engine was given (read off any of its parameters' full names)."""
        local, full = next(iter(self.names.items()))
        return full[: len(full) - len(local)].removesuffix(".")

    def capture_hooks(self) -> list[Hook]:
        """The forward hooks that capture this rule's calls: a pre-hook on the layer marks where a call starts
        (:meth:`start_call`), a hook after it captures the call's input and its output's gradient edge
        (:meth:`capture`). Rules whose parameters act inside a larger module capture elsewhere (ViT tokens, layer
        scale, activated norms)."""
        return [Hook(self.module, True, self.start_call, first=False), Hook(self.module, False, self._capture_call)]

    def start_call(self, *_) -> None:
        """Mark where a call starts: the nodes it creates are numbered after this (``core/ghost/graph.py``)."""
        self.start = sequence_marker()

    def capture(self, tensor: Tensor, edge: tuple[object, torch.Size], **details: object) -> None:
        """Record one call: the tensor the rule differentiates at, its output's :func:`output_edge`, and the
        :class:`Capture` fields a rule reads besides (``others``, ``output``, ``part``)."""
        self.calls.append(Capture(tensor.detach(), tensor._version, *edge, self.start, **details))

    def _capture_call(self, mod: nn.Module, args: tuple, kwargs: dict, out: object) -> None:
        self.capture(one_tensor_call(mod, args, kwargs, out), output_edge(out))

    def reset(self) -> None:
        """Forget the calls, streamed gradients and cache of the last forward (a step that failed between the norms
        and the sum must not leave its cache to the next)."""
        self.calls, self.streamed, self._cache = [], None, None

    def prefers_streaming(self, examples: int) -> bool:
        """Whether forming this forward's per-example gradients during the backward frees memory (they fit in the
        captures they replace: mixed book-keeping, Bu et al. 2023). Only rules that implement
        :meth:`call_gradients` stream."""
        return False

    def per_example_fits_captures(self, examples: int) -> bool:
        """Whether this forward's per-example gradients (``examples x p`` values) are no larger than its captured
        inputs and output gradients (read while every call still holds its input)."""
        per_example = examples * sum(p.numel() for p in self.tensors().values())
        return per_example <= sum(call.inputs.numel() + call.shape.numel() for call in self.calls)

    def call_gradients(self, inputs: Tensor, grad: Tensor, examples: int) -> dict[str, Tensor]:
        """Per-example gradients ``local name -> [B, *shape]`` of one call, from its input and output gradient."""
        raise NotImplementedError

    def gradients_of(self, call: Capture, grad: Tensor, examples: int) -> dict[str, Tensor]:
        """Per-example gradients of one captured call, given its output gradient."""
        return self.call_gradients(call.inputs, grad, examples)

    def stream(self, call: Capture, grad: Tensor | None, examples: int) -> None:
        """Called during the backward with the call's output gradient: adds the call's per-example gradients to
        :attr:`streamed` and drops the call's input, so neither the input nor the output gradient outlives it."""
        call.check_unchanged()
        if grad is not None:
            self.streamed = _added(self.streamed or {}, self.gradients_of(call, grad.view(call.shape), examples))
        call.inputs, call.others, call.output = None, ((), {}), None

    def keeps_per_example(self, examples: int) -> bool:
        """Whether this forward's per-example gradients are materialized and kept until the clip factors are known
        (:meth:`per_example_gradients`; the engine then takes their norms and weighted sum with every other kept
        layer's at once, book-keeping). Otherwise the rule gives :meth:`sq_norms` and :meth:`clipped_sum`."""
        return False

    def per_example_gradients(self, examples: int) -> dict[str, Tensor]:
        """The streamed per-example gradients plus those of the calls captured whole (``local name -> [B, *shape]``;
        none for a layer no call of which reached the losses); drops them from the rule."""
        total = self.streamed or {}
        self.streamed = None
        for call in self.calls:
            if call.grad is not None:
                total = _added(total, self.gradients_of(call, call.grad, examples))
        return total

    def sq_norms(self, examples: int) -> Tensor:
        """``[B]`` squared per-example gradient norms of this rule's parameters (rules that keep no per-example
        gradients)."""
        raise NotImplementedError

    def clipped_sum(self, factors: Tensor) -> dict[str, Tensor]:
        """``full name -> sum_i factors[i] grad_i`` (rules that keep no per-example gradients)."""
        raise NotImplementedError


@register_rule(nn.Linear)
class LinearRule(LayerRule):
    """``nn.Linear`` on inputs ``[N, ..., d]``: mixed ghost / materialized norm, book-keeping clipped sum."""

    _cache: tuple[Tensor, Tensor] | None = None
    """``(inputs [B, T, d], output gradients [B, T, p])`` of every position, from :meth:`sq_norms` to
    :meth:`clipped_sum`."""

    def capture(self, tensor: Tensor, edge: tuple[object, torch.Size], **details: object) -> None:
        if tensor.dim() < 2:
            raise UnsupportedCall(
                f"a {type(self.module).__name__} saw a 1-D input: the ghost engine needs batched [N, ..., d] inputs"
            )
        super().capture(tensor, edge, **details)

    def _positions(self, examples: int) -> tuple[Tensor, Tensor]:
        acts, grads = [], []
        for call in self.calls:
            a, g = self._rows(call)
            acts.append(group_rows(a, examples).flatten(1, 2))
            grads.append(group_rows(g, examples).flatten(1, 2))
        if len(acts) == 1:
            return acts[0], grads[0]
        return torch.cat(acts, dim=1), torch.cat(grads, dim=1)

    def _rows(self, call: Capture) -> tuple[Tensor, Tensor]:
        a, g = call.inputs, call.grad
        return a.reshape(a.shape[0], -1, a.shape[-1]), g.reshape(g.shape[0], -1, g.shape[-1])

    def sq_norms(self, examples: int) -> Tensor:
        a, g = self._positions(examples)
        self._cache = (a, g)
        if "weight" in self.names:
            return weight_sq_norms(a, g, with_bias="bias" in self.names)
        return g.sum(dim=1).square().sum(dim=1)

    def clipped_sum(self, factors: Tensor) -> dict[str, Tensor]:
        a, g = self._cache
        del self._cache
        scaled = g * factors.to(g.dtype)[:, None, None]
        out = {}
        if "weight" in self.names:
            out[self.names["weight"]] = self._weight_product(scaled.flatten(0, 1), a.flatten(0, 1))
        if "bias" in self.names:
            out[self.names["bias"]] = scaled.sum(dim=(0, 1))
        return out

    def _weight_product(self, rows: Tensor, inputs: Tensor) -> Tensor:
        """``G^T A`` as the weight, from output-gradient rows ``[M, p]`` and input rows ``[M, d]``."""
        return (rows.T @ inputs).view_as(self.module.weight)


def frobenius_products(x: Tensor, y: Tensor) -> Tensor:
    """``[B]``: ``<x_i, y_i>`` of each example's ``[T, T]`` matrices. On a GPU one batched product of ``1 x T^2`` by
    ``T^2 x 1`` matrices (one kernel: launches were what a GPU step waited on, ``benchmarks/dp_profile.py``); on CPU an
    elementwise product and a sum, as the batched product of such thin matrices is slow there (``cnn_tanh``'s second
    layer at batch 64, one thread: 0.12 against 0.012 ms)."""
    if x.device.type == "cpu":
        return (x * y).sum(dim=(1, 2))
    return torch.bmm(x.view(x.shape[0], 1, -1), y.view(y.shape[0], -1, 1)).view(x.shape[0])


def weight_sq_norms(a: Tensor, g: Tensor, with_bias: bool) -> Tensor:
    """``||G_i^T A_i||_F^2`` for each example (plus the bias's ``||G_i^T 1||^2`` when ``with_bias``): ghost norm when
    ``T (d + p) < d p``, else materialized. The bias is the weight of a constant input 1, so the ghost norm adds it
    as ``<A A^T + 1 1^T, G G^T>`` and a single position as ``(||a||^2 + 1) ||g||^2``: one kernel, not three. Kernel
    launches were what a GPU step waited on (``benchmarks/dp_profile.py``)."""
    positions, d, p = a.shape[1], a.shape[2], g.shape[2]
    if positions == 1:
        return (squared_norms(a) + 1 if with_bias else squared_norms(a)) * squared_norms(g)
    if positions * (d + p) < d * p:
        gram = torch.bmm(a, a.transpose(1, 2))
        if with_bias:
            gram += 1
        return frobenius_products(gram, torch.bmm(g, g.transpose(1, 2)))
    total = squared_norms(torch.bmm(g.transpose(1, 2), a))
    return total + g.sum(dim=1).square().sum(dim=1) if with_bias else total


class _OwnForward(nn.Module):
    """Runs a layer's ``forward`` without the hooks its ``__call__`` runs: the rules capture the input the layer
    computed on (after any pre-hook) and its own output (before any hook, :attr:`Hook.first`), so a re-run must not
    apply a user's hooks a second time."""

    def __init__(self, layer: nn.Module) -> None:
        super().__init__()
        self.layer = layer

    def forward(self, *args: object, **kwargs: object) -> Tensor:
        return self.layer.forward(*args, **kwargs)


class MaterializedRule(LayerRule):
    """Any deterministic module with its own parameters: per-example gradients by ``vmap(vjp)`` of the module alone.

    Used for small layers without a closed form (PReLU, MetaFormer's StarReLU, subclasses that override a layer's
    forward; normalization layers, embeddings and scales have one): the module is re-run on each example's captured
    input, which is exact when the module is deterministic (no active dropout) and its output depends on its input
    and parameters only. When the per-example gradients are no larger than the captures (normalization layers: ``2
    C`` values per example against ``2 C H W``), they are formed during the backward (:meth:`LayerRule.stream`) and
    the captures dropped at once.
    """

    def prefers_streaming(self, examples: int) -> bool:
        return self.per_example_fits_captures(examples)

    @cached_property
    def _unhooked(self) -> nn.Module:
        return _OwnForward(self.module)

    def call_gradients(self, inputs: Tensor, grad: Tensor, examples: int) -> dict[str, Tensor]:
        """The layer's own ``forward`` re-run (:class:`_OwnForward`) on each example's captured input and pulled back
        from its output gradient."""
        return self._rerun(inputs, grad, examples)[1]

    def _rerun(
        self,
        inputs: Tensor,
        grad: Tensor,
        examples: int,
        others: tuple[tuple, dict] = ((), {}),
        split: Set = frozenset(),
    ) -> tuple[Tensor, dict[str, Tensor]]:
        """``vmap(vjp)`` of the module's own ``forward`` on each example's rows of ``inputs``, with the other arguments
        ``others`` (those whose positions or names are in ``split`` split by example too, the rest passed whole):
        the outputs ``[B, N / B, ...]`` and the per-example gradients of the module's own parameters (zeros where
        an output's shape is not its gradient's: a wrong split). Under ``no_grad``: the re-run builds no graph for
        sub-layers' parameters."""
        params = {f"layer.{local}": p.detach() for local, p in self.tensors().items()}
        rest, kwargs = others
        mine = {key: group_rows(v, examples) for key, v in [*enumerate(rest), *kwargs.items()] if key in split}

        def example_grads(a: Tensor, g: Tensor, own: dict) -> tuple[Tensor, dict[str, Tensor]]:
            args = (a, *(own.get(i, v) for i, v in enumerate(rest)))
            named = {k: own.get(k, v) for k, v in kwargs.items()}
            out, pullback = vjp(lambda p: stateless_call(self._unhooked, p, args, named), params)
            grads = (
                pullback(g)[0] if out.shape == g.shape else {name: torch.zeros_like(p) for name, p in params.items()}
            )
            return out, {name.removeprefix("layer."): grad for name, grad in grads.items()}

        try:
            with torch.no_grad():
                return vmap(example_grads)(group_rows(inputs, examples), group_rows(grad, examples), mine)
        except RuntimeError as error:
            if "random" not in str(error):
                raise
            raise RuntimeError(
                f"{type(self.module).__name__} draws random numbers in its forward (e.g. F.dropout): the ghost engine "
                "re-runs the layer on each example's captured input and cannot replay its draws; use "
                "DPCallback(engine='vmap'), or draw them in a module of their own (nn.Dropout)"
            ) from error

    def keeps_per_example(self, examples: int) -> bool:
        return True


class CompositeRule(MaterializedRule):
    """A module that owns parameters and calls sub-layers with parameters of their own, where no closed form applies
    (blocks' scales on a sub-layer's output have one, :class:`LayerScaleRule`): Swin's window attention and its
    relative position bias table (Liu et al. 2021, arXiv 2103.14030), LeViT's and EfficientFormer's attention biases,
    a self-attention layer's output scale. Its own parameters' per-example gradients come from
    ``vmap(vjp)`` of its ``forward`` re-run on each example's captured arguments, the sub-layers' parameters held
    fixed (their own rules cover them).

    Cost: about one more forward and backward of the module, so modules holding more than :attr:`MAX_SHARE` of the
    model's trainable parameters are left to the vmap engine (:meth:`small_enough`). Assumptions, as for
    :class:`MaterializedRule`: the module is deterministic (no active dropout or drop path inside it; checked when
    planning). Calls with a tensor first and one tensor out are re-run (others go to the vmap engine); the first
    argument holds the call's rows. Another tensor argument with as many
    rows may be per row (a padding mask) or shared (Swin's window mask, one per window, when the batch holds one
    example): such arguments are split by example first, then fewer of them, until a re-run reproduces the call's
    output; a call that none reproduces is refused.
    """

    MAX_SHARE = 0.25
    REPRODUCED = 1e-2
    """Relative L2 distance under which a re-run's outputs reproduce the call's (float32 and TF32 rounding differ
    between batch shapes; a wrong split of an argument gives distances of order one)."""

    @staticmethod
    def small_enough(module: nn.Module, total_parameters: int) -> bool:
        """Whether ``module`` (sub-layers included) holds at most :attr:`MAX_SHARE` of ``total_parameters``."""
        return parameter_count(module.parameters()) <= CompositeRule.MAX_SHARE * total_parameters

    def _capture_call(self, mod: nn.Module, args: tuple, kwargs: dict, out: object) -> None:
        """Captures a call with a tensor first and one tensor out; another call is not captured, so its parameters'
        gradient comes from outside the rule's calls and the graph check moves them to the vmap engine."""
        if not args or not isinstance(args[0], Tensor) or not isinstance(out, Tensor):
            return
        others = (tuple(map(_detached, args[1:])), {k: _detached(v) for k, v in kwargs.items()})
        self.capture(args[0], output_edge(out), others=others, output=out.detach())

    def gradients_of(self, call: Capture, grad: Tensor, examples: int) -> dict[str, Tensor]:
        rest, kwargs = call.others
        rows = call.inputs.shape[0]
        with_rows = {
            key
            for key, v in [*enumerate(rest), *kwargs.items()]
            if isinstance(v, Tensor) and v.dim() and v.shape[0] == rows
        }
        for size in range(len(with_rows), -1, -1):  # every such argument split first, then fewer
            for split in combinations(sorted(with_rows, key=str), size):
                outputs, grads = self._rerun(call.inputs, grad, examples, call.others, set(split))
                outputs = outputs.flatten(0, 1)
                if outputs.shape == call.output.shape and self._reproduces(outputs, call.output):
                    return grads
        raise RuntimeError(
            f"re-running {type(self.module).__name__} on each example's arguments does not reproduce its output: it "
            "mixes examples or draws random numbers; use engine='vmap'"
        )

    def _reproduces(self, outputs: Tensor, output: Tensor) -> bool:
        return bool((outputs - output).norm() <= self.REPRODUCED * output.norm())


def parameter_count(parameters: Iterable[Tensor]) -> int:
    """The number of values of ``parameters``; a lazy module's uninitialized ones count none."""
    return sum(p.numel() for p in parameters if not is_lazy(p))


def _detached(value: object) -> object:
    return value.detach() if isinstance(value, Tensor) else value


def _scale_types() -> dict[type, str]:
    """timm's per-channel scale modules -> the name of their parameter."""
    from timm.layers import LayerScale, LayerScale2d
    from timm.models.metaformer import Scale

    return {LayerScale: "gamma", LayerScale2d: "gamma", Scale: "scale"}


@register_rule()
class ChannelScaleRule(MaterializedRule):
    """timm's per-channel scale modules, ``x * gamma``: ``LayerScale`` (channels last, as in ViT blocks with
    ``init_values``; Touvron et al. 2021, CaiT, arXiv 2103.17239), ``LayerScale2d`` (``NCHW``) and MetaFormer's
    ``Scale`` (either layout; Yu et al. 2022, arXiv 2210.13452: PoolFormer). The output is linear in the scale, so
    each example's gradient is the sum over positions of ``g * x``: no ``vmap`` of the module.

    Exact types only, and not their ``inplace=True`` form (:meth:`in_place`)."""

    @classmethod
    def applies(cls, module: nn.Module, names: Collection[str]) -> bool:
        return cls.supports(module)

    @staticmethod
    def supports(module: nn.Module) -> bool:
        return type(module) in _scale_types() and not ChannelScaleRule.in_place(module)

    @staticmethod
    def in_place(module: nn.Module) -> bool:
        """Whether ``module`` is one of these scales multiplying its input in place: the input the rules capture is
        overwritten, so no rule can read it (the vmap engine runs such a layer)."""
        return type(module) in _scale_types() and getattr(module, "inplace", False)

    refuses = in_place

    @cached_property
    def channels_first(self) -> bool:
        """Whether the scaled channels are dim 1 (``NCHW``) rather than the last dim."""
        from timm.layers import LayerScale2d

        return type(self.module) is LayerScale2d or len(getattr(self.module, "shape", ())) == 3

    def call_gradients(self, inputs: Tensor, grad: Tensor, examples: int) -> dict[str, Tensor]:
        return dict.fromkeys(self.names, channel_sums(inputs, grad, examples, self.channels_first))


def channel_sums(inputs: Tensor, grad: Tensor, examples: int, channels_first: bool) -> Tensor:
    """``[B, C]``: each example's gradient of a per-channel scale ``gamma * x``, the sum over its positions (and rows)
    of ``g * x``; the channels are dim 1 (``NCHW``) or the last dim."""
    rows = group_rows(grad * inputs, examples)  # [B, k, ...]
    if channels_first:
        rows = rows.movedim(2, -1)
    return rows.reshape(examples, -1, rows.shape[-1]).sum(dim=1)


class Branch(NamedTuple):
    """Where a block's per-channel scale acts: ``scale * branch(...)`` is passed to ``drop``."""

    branch: str
    """The sub-layer whose output is scaled."""
    drop: str
    """The sub-layer the product is passed to (stochastic depth, or ``nn.Identity``)."""
    layout: Callable[[nn.Module, Tensor], Tensor] = lambda block, y: y
    """The branch output in the product's layout (the block may permute it before scaling)."""


def _block_scales() -> dict[type, tuple[bool, dict[str, Branch]]]:
    """timm blocks that own per-channel scales on their sub-layers' outputs -> (channels first, scale -> branch)."""
    from timm.models.cait import LayerScaleBlock, LayerScaleBlockClassAttn
    from timm.models.convnext import ConvNeXtBlock
    from timm.models.mlp_mixer import ResBlock

    cait = {"gamma_1": Branch("attn", "drop_path"), "gamma_2": Branch("mlp", "drop_path")}
    return {
        ConvNeXtBlock: (
            True,
            {"gamma": Branch("mlp", "drop_path", lambda b, y: y if b.use_conv_mlp else y.permute(0, 3, 1, 2))},
        ),
        LayerScaleBlock: (False, cait),
        LayerScaleBlockClassAttn: (False, cait),
        ResBlock: (
            False,
            {
                "ls1": Branch("linear_tokens", "drop_path", lambda b, y: y.transpose(1, 2)),
                "ls2": Branch("mlp_channels", "drop_path"),
            },
        ),
    }


@register_rule()
class LayerScaleRule(MaterializedRule):
    """Per-channel scales that timm blocks own and apply to a sub-layer's output before the residual add: ConvNeXt's
    ``gamma`` (Liu et al. 2022, arXiv 2201.03545), CaiT's ``gamma_1`` and ``gamma_2`` in its layer-scale and
    class-attention blocks (Touvron et al. 2021, arXiv 2103.17239), ResMLP's ``ls1`` and ``ls2`` (Touvron et al.
    2021, arXiv 2105.03404).

    The product is linear in the scale, so each example's gradient is the sum over positions of ``g * y``, with ``y``
    the branch's output (captured at its output, in the product's layout) and ``g`` the gradient at the product
    (captured at the input of the layer it is passed to, so stochastic depth changes nothing): :func:`channel_sums`,
    captured at other points. A block's branches run in order, each product passed on before the next branch runs,
    so each capture of a product pairs with the oldest branch output not yet paired.
    """

    @classmethod
    def applies(cls, module: nn.Module, names: Collection[str]) -> bool:
        return cls.supports(module, names)

    @staticmethod
    def supports(block: nn.Module, names: Collection[str]) -> bool:
        """An exact type of :func:`_block_scales` (subclasses may change ``forward``) whose sub-layers are present,
        for parameters among its scales."""
        spec = _block_scales().get(type(block))
        return (
            spec is not None
            and set(names) <= set(spec[1])
            and all(isinstance(getattr(block, b.branch, None), nn.Module) for b in spec[1].values())
            and all(isinstance(getattr(block, b.drop, None), nn.Module) for b in spec[1].values())
        )

    @cached_property
    def channels_first(self) -> bool:
        return _block_scales()[type(self.module)][0]

    def capture_hooks(self) -> list[Hook]:
        """Each branch's output per call of the block, and the gradient edge at the input of the layer its product
        goes to."""
        block, pending = self.module, []
        branches = _block_scales()[type(block)][1]

        def start_call(*_) -> None:
            self.start_call()
            pending.clear()

        def branch_output(name: str, layout: Callable) -> Callable:
            def hook(mod: nn.Module, args: tuple, kwargs: dict, out: Tensor) -> None:
                pending.append((name, layout(block, out)))

            return hook

        def scaled(mod: nn.Module, args: tuple, kwargs: dict) -> None:
            name, y = pending.pop(0)
            self.capture(y, output_edge(args[0]), part=name)

        outputs = [Hook(getattr(block, b.branch), False, branch_output(n, b.layout)) for n, b in branches.items()]
        drops = {b.drop for b in branches.values()}
        return [
            Hook(block, True, start_call, first=False),
            *outputs,
            *(Hook(getattr(block, d), True, scaled) for d in drops),
        ]

    def gradients_of(self, call: Capture, grad: Tensor, examples: int) -> dict[str, Tensor]:
        if call.part not in self.names:
            return {}
        return {call.part: channel_sums(call.inputs, grad, examples, self.channels_first)}
