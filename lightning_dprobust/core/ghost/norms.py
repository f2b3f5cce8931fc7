"""Closed-form per-example gradients of GroupNorm and LayerNorm affine parameters.

A normalization layer computes ``y = x_hat * w + b`` where ``x_hat`` normalizes each example alone (GroupNorm: per
group of channels, Wu and He 2018, arXiv 1803.08494; LayerNorm: over the trailing ``normalized_shape`` dims, Ba et al.
2016, arXiv 1607.06450). With ``g = dL/dy``, one example's gradients are

    ``dL/dw = sum over positions of g * x_hat``,   ``dL/db = sum over positions of g``,

where the positions are the dims ``w`` broadcasts over (GroupNorm and timm's ``LayerNorm2d``, which normalizes the
channels of each position of ``NCHW`` maps, as in ConvNeXt: the spatial dims; LayerNorm: the leading dims other than
the batch). ``x_hat`` is recomputed from the captured input by the same normalization without the affine
map, so one rule costs one normalization forward, one product and two reductions: no ``vmap`` of the layer's forward
and backward (:class:`~lightning_dprobust.core.ghost.layers.MaterializedRule`, which these rules specialize).

Only layers whose forward is exactly that formula are covered: ``nn.GroupNorm`` and ``nn.LayerNorm``, timm's
``GroupNorm``, ``GroupNorm1`` (PoolFormer's), ``LayerNorm`` and ``LayerNorm2d`` (their plain, not "fast", path)
and timm's ``GroupNormAct`` (what ``models.make_dp_compatible`` builds from ``BatchNormAct2d``), whatever its dropout
and activation: its ``g`` is captured at the input of its ``drop`` module, which is the affine map's output
(:attr:`NormRule.affine_output_of`), so the layers after the map need no formula (MobileNetV3's Hardswish,
EfficientNet's SiLU). Other subclasses keep the generic rule.
"""

from __future__ import annotations

from functools import cached_property

import torch.nn.functional as F
from torch import Tensor, nn

from lightning_dprobust.core.ghost.layers import (
    Hook,
    MaterializedRule,
    UnsupportedCall,
    group_rows,
    one_tensor_call,
    output_edge,
)
from lightning_dprobust.core.ghost.registry import register_rule


def _exact_types() -> dict[type, str]:
    from timm.layers import GroupNorm, GroupNorm1, GroupNormAct, LayerNorm, LayerNorm2d

    groups = {nn.GroupNorm: "group", GroupNorm: "group", GroupNorm1: "group", GroupNormAct: "group"}
    return groups | {nn.LayerNorm: "layer", LayerNorm: "layer", LayerNorm2d: "channels"}


def norm_kind(module: nn.Module) -> str | None:
    """``"group"``, ``"layer"`` or ``"channels"`` (timm's ``LayerNorm2d``) for a normalization layer this module's
    closed form covers, else ``None``."""
    kind = _exact_types().get(type(module))
    if kind is None or getattr(module, "_fast_norm", False):
        return None
    return kind


@register_rule()
class NormRule(MaterializedRule):
    """GroupNorm / LayerNorm affine parameters: per-example gradients in closed form (see the module docstring)."""

    @staticmethod
    def supports(module: nn.Module) -> bool:
        return norm_kind(module) is not None

    @cached_property
    def affine_output_of(self) -> nn.Module | None:
        """timm ``GroupNormAct``'s ``drop`` module, whose input is the affine map's output (its forward is
        ``act(drop(group_norm(x)))``): the output gradient is captured there, before the dropout and the
        activation. ``None`` for the plain normalization layers, captured at their own output."""
        from timm.layers import GroupNormAct

        return self.module.drop if type(self.module) is GroupNormAct else None

    def capture_hooks(self) -> list[Hook]:
        """As any layer's, except that a ``GroupNormAct``'s output gradient edge is taken at its
        :attr:`affine_output_of` module's input, in a pre-hook: before an in-place activation could give the tensor a
        new edge."""
        inner = self.affine_output_of
        if inner is None:
            return super().capture_hooks()
        edges: list[tuple[object, object]] = []  # the inner module's input edges, in a call of the layer

        def start_call(*_) -> None:
            self.start_call()
            edges.clear()

        def capture_call(mod: nn.Module, args: tuple, kwargs: dict, out: object) -> None:
            inputs = one_tensor_call(mod, args, kwargs, out)
            if len(edges) != 1:
                raise UnsupportedCall(
                    f"{type(mod).__name__} called its {type(inner).__name__} {len(edges)} times, not once: the "
                    "ghost engine captures the affine map's output there; use engine='vmap'"
                )
            self.capture(inputs, edges.pop())

        def inner_input(mod: nn.Module, args: tuple, kwargs: dict) -> None:
            edges.append(output_edge(args[0]))

        return [
            Hook(self.module, True, start_call, first=False),
            Hook(self.module, False, capture_call),
            Hook(inner, True, inner_input),
        ]

    @cached_property
    def kind(self) -> str:
        """``"group"``, ``"layer"`` or ``"channels"`` (:func:`norm_kind`, read once: it runs for every call of the
        layer)."""
        return norm_kind(self.module)

    def _normalized(self, inputs: Tensor) -> Tensor:
        norm = self.module
        if self.kind == "group":
            return F.group_norm(inputs, norm.num_groups, eps=norm.eps)
        if self.kind == "channels":  # LayerNorm2d: each position's channels of NCHW maps
            return F.layer_norm(inputs.permute(0, 2, 3, 1), norm.normalized_shape, eps=norm.eps).permute(0, 3, 1, 2)
        return F.layer_norm(inputs, norm.normalized_shape, eps=norm.eps)

    def _position_dims(self, rows: Tensor) -> tuple[int, ...]:
        """The dims of ``[B, k, ...]`` grouped rows that the affine parameters broadcast over (``k`` included)."""
        if self.kind in ("group", "channels"):
            return (1, *range(3, rows.dim()))
        return tuple(range(1, rows.dim() - len(self.module.normalized_shape)))

    def call_gradients(self, inputs: Tensor, grad: Tensor, examples: int) -> dict[str, Tensor]:
        g = group_rows(grad, examples)
        dims = self._position_dims(g)
        out = {}
        if "weight" in self.names:
            out["weight"] = (g * group_rows(self._normalized(inputs), examples)).sum(dim=dims)
        if "bias" in self.names:
            out["bias"] = g.sum(dim=dims)
        return out
