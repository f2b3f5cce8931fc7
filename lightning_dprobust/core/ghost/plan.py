"""Which per-layer rule covers each trainable parameter of a model for the ghost engine (``core/ghost/clipper.py``).

:func:`plan_rules` walks the model's modules once and gives each module owning trainable parameters the rule that
applies to it: first a registered rule (``core/ghost/registry.py``: the closed forms of ``core/ghost/layers.py``,
``conv.py``, ``embedding.py``, ``norms.py`` and ``tokens.py``, each registered per layer type or testing modules
itself), then a re-run of a deterministic leaf module
(:class:`~lightning_dprobust.core.ghost.layers.MaterializedRule`) or of a small module that calls sub-layers of its
own (:class:`~lightning_dprobust.core.ghost.layers.CompositeRule`), then captures on the autograd graph
(``core/ghost/functional.py``). Parameters no rule covers (tied between modules, a parametrization's originals, a
module that draws dropout) are left to the vmap engine. The engine plans again whenever the trainable parameters
change.
"""

from __future__ import annotations

from collections.abc import Collection

from torch import nn
from torch.nn.utils.parametrize import ParametrizationList

# the rule modules register their rules (registry.register_rule) when imported
from lightning_dprobust.core.ghost import conv, embedding, norms, tokens  # noqa: F401
from lightning_dprobust.core.ghost.functional import broadcast_rules
from lightning_dprobust.core.ghost.layers import (
    CompositeRule,
    LayerRule,
    MaterializedRule,
    parameter_count,
    runs_forward_of,
)
from lightning_dprobust.core.ghost.registry import LAYER_RULES, MODULE_RULES


def is_stochastic(module: nn.Module) -> bool:
    return any(
        (isinstance(m, nn.modules.dropout._DropoutNd) and m.p > 0) or getattr(m, "drop_prob", 0) > 0
        for m in module.modules()
    )


def registered_rule(module: nn.Module, names: Collection[str]) -> type[LayerRule] | None:
    """The registered rule that applies to ``module``'s trainable parameters ``names`` (local names): the rule of the
    layer type whose map the module computes, else the first rule that tests modules itself and takes it."""
    for layer, rule in LAYER_RULES.items():
        if runs_forward_of(module, layer) and rule.applies(module, names):
            return rule
    return next((rule for rule in MODULE_RULES if rule.applies(module, names)), None)


def _rule_for(module: nn.Module, names: dict[str, str], total_parameters: int) -> LayerRule | None:
    """The rule for a module's own trainable parameters (``local -> full name``), or ``None`` (vmap fallback);
    ``total_parameters`` is the model's count, which bounds the modules a :class:`CompositeRule` re-runs.

    A registered rule refusing the module (an in-place scale), a parametrization's originals
    (``nn.utils.parametrize``: ``parametrizations.weight_norm``, ``spectral_norm``: their module is called with no
    input when its layer reads the weight) and a module that draws dropout go to the vmap engine."""
    rule = registered_rule(module, names)
    if rule is not None:
        return rule(module, names)
    if any(rule.refuses(module) for rule in (*LAYER_RULES.values(), *MODULE_RULES)):
        return None
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
