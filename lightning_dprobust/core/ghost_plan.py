"""Which per-layer rule covers each trainable parameter of a model for the ghost engine (``core/ghost.py``).

:func:`plan_rules` walks the model's modules once and gives each module owning trainable parameters the first rule
that applies to it: the closed forms of ``core/ghost_layers.py``, ``core/ghost_conv.py``, ``core/ghost_embedding.py``,
``core/ghost_norms.py`` and ``core/ghost_tokens.py``, then a re-run of a deterministic leaf module
(:class:`~lightning_dprobust.core.ghost_layers.MaterializedRule`) or of a small module that calls sub-layers of its
own (:class:`~lightning_dprobust.core.ghost_layers.CompositeRule`), then captures on the autograd graph
(``core/ghost_functional.py``). Parameters no rule covers (tied between modules, a parametrization's originals, a
module that draws dropout) are left to the vmap engine. The engine plans again whenever the trainable parameters
change.
"""

from __future__ import annotations

from collections.abc import Collection

from torch import nn
from torch.nn.utils.parametrize import ParametrizationList

from lightning_dprobust.core.ghost_conv import Conv1dRule, Conv2dRule
from lightning_dprobust.core.ghost_embedding import EmbeddingRule
from lightning_dprobust.core.ghost_functional import broadcast_rules
from lightning_dprobust.core.ghost_layers import (
    ChannelScaleRule,
    CompositeRule,
    LayerRule,
    LayerScaleRule,
    LinearRule,
    MaterializedRule,
    parameter_count,
    runs_forward_of,
)
from lightning_dprobust.core.ghost_norms import NormRule
from lightning_dprobust.core.ghost_tokens import TOKEN_NAMES, CaiTTokenRule, CrossViTTokenRule, TokenRule


def is_stochastic(module: nn.Module) -> bool:
    return any(
        (isinstance(m, nn.modules.dropout._DropoutNd) and m.p > 0) or getattr(m, "drop_prob", 0) > 0
        for m in module.modules()
    )


def _rule_for(module: nn.Module, names: dict[str, str], total_parameters: int) -> LayerRule | None:
    """The rule for a module's own trainable parameters (``local -> full name``), or ``None`` (vmap fallback);
    ``total_parameters`` is the model's count, which bounds the modules a :class:`CompositeRule` re-runs.

    The closed-form rules need the layer's own ``weight`` / ``bias`` (not, e.g., the ``weight_g`` and ``weight_v`` of
    ``nn.utils.weight_norm``, whose hook forms the weight). A parametrization's originals
    (``nn.utils.parametrize``: ``parametrizations.weight_norm``, ``spectral_norm``) go to the vmap engine: their
    module is called with no input when its layer reads the weight."""
    affine = set(names) <= {"weight", "bias"}
    if affine and runs_forward_of(module, nn.Linear):
        return LinearRule(module, names)
    if affine and runs_forward_of(module, nn.Conv2d) and Conv2dRule.supports(module):
        return Conv2dRule(module, names)
    if affine and runs_forward_of(module, nn.Conv1d) and Conv1dRule.supports(module):
        return Conv1dRule(module, names)
    if affine and runs_forward_of(module, nn.Embedding) and EmbeddingRule.supports(module):
        return EmbeddingRule(module, names)
    if LayerScaleRule.supports(module, names):
        return LayerScaleRule(module, names)
    if ChannelScaleRule.supports(module):
        return ChannelScaleRule(module, names)
    if ChannelScaleRule.in_place(module):
        return None
    if set(names) <= TOKEN_NAMES and TokenRule.supports(module):
        return TokenRule(module, names)
    if set(names) <= {"cls_token_0", "cls_token_1", "pos_embed_0", "pos_embed_1"} and CrossViTTokenRule.supports(
        module
    ):
        return CrossViTTokenRule(module, names)
    if set(names) <= CaiTTokenRule.NAMES and CaiTTokenRule.supports(module):
        return CaiTTokenRule(module, names)
    if affine and NormRule.supports(module):
        return NormRule(module, names)
    if isinstance(module, ParametrizationList):
        return None
    if is_stochastic(module):
        return None
    if not any(True for child in module.children() for _ in child.parameters()):
        return MaterializedRule(module, names)
    if CompositeRule.small_enough(module, total_parameters):
        return CompositeRule(module, names)
    return None


def plan_rules(module: nn.Module, parameter_names: Collection[str] | None = None) -> tuple[list[LayerRule], list[str]]:
    """Per-layer rules covering ``module``'s trainable parameters (only those in ``parameter_names`` when given), and
    the names of those left to the vmap engine. A layer owning none of them gets no rule (and is never captured).

    A parameter owned by several modules (tied weights) gets no rule: its gradient is the sum over its owners' calls,
    whose norm no single layer rule can compute; its owners' parameters all go to the vmap engine.
    """
    owners: dict[int, int] = {}
    for sub in module.modules():
        for p in sub.parameters(recurse=False):
            owners[id(p)] = owners.get(id(p), 0) + 1
    rules, leftover = [], []
    total_parameters = parameter_count(p for p in module.parameters() if p.requires_grad)
    for prefix, sub in module.named_modules():
        names = {local: f"{prefix}.{local}" if prefix else local for local, p in sub.named_parameters(recurse=False)}
        names = {
            local: full
            for local, full in names.items()
            if getattr(sub, local).requires_grad and (parameter_names is None or full in parameter_names)
        }
        if not names:
            continue
        if any(owners[id(getattr(sub, local))] > 1 for local in names):
            leftover.extend(names.values())
            continue
        rule = _rule_for(sub, names, total_parameters)
        found = [rule] if rule is not None else broadcast_rules(sub, names)  # uses captured on the graph
        rules.extend(found)
        if not found:
            leftover.extend(names.values())
    return rules, leftover
