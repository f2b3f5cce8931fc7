"""The ghost engine's rules, registered per layer type as Opacus registers its grad samplers
(``@register_grad_sampler(nn.Linear)`` into a dict keyed by module type).

A rule module decorates each rule class with :func:`register_rule`: ``@register_rule(nn.Linear)`` files it under the
layer type whose map it computes (:data:`LAYER_RULES`; a module gets it when it runs that layer's ``forward``,
``layers.runs_forward_of``); ``@register_rule()`` files a rule that tests modules itself (:data:`MODULE_RULES`: timm's
scales, blocks, tokens and normalization layers, whose classes are imported only when a model is planned). Each rule
says which modules it takes (:meth:`~lightning_dprobust.core.ghost.layers.LayerRule.applies`) and which no rule may
take (:meth:`~lightning_dprobust.core.ghost.layers.LayerRule.refuses`: the vmap engine runs them).
``core/ghost/plan.py`` looks rules up here and falls back to the generic rules when none applies. The registered
rules take disjoint modules (exact types, or parameter names no other rule takes), so the order in which they are
tried does not change a plan.

This module imports no rule: registering is done by importing the rule modules (``plan.py`` imports them all).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from torch import nn

Rule = TypeVar("Rule", bound=type)
"""A subclass of :class:`~lightning_dprobust.core.ghost.layers.LayerRule` (not imported: the rule modules import
this one)."""

LAYER_RULES: dict[type[nn.Module], type] = {}
"""Layer type -> the rule for the modules that compute that layer's map (``nn.Linear``, ``nn.Conv2d``, ...)."""
MODULE_RULES: list[type] = []
"""Rules that test each module themselves, in registration order."""


def register_rule(*layers: type[nn.Module]) -> Callable[[Rule], Rule]:
    """Class decorator filing a rule under each of ``layers`` (:data:`LAYER_RULES`), or, with none, among the rules
    that test modules themselves (:data:`MODULE_RULES`). A layer type registered twice is refused."""

    def register(rule: Rule) -> Rule:
        taken = [layer.__name__ for layer in layers if layer in LAYER_RULES and LAYER_RULES[layer] is not rule]
        if taken:
            raise ValueError(f"{rule.__name__}: {', '.join(taken)} already have a ghost rule")
        for layer in layers:
            LAYER_RULES[layer] = rule
        if not layers and rule not in MODULE_RULES:
            MODULE_RULES.append(rule)
        return rule

    return register
