"""The ghost engine's rules are registered per layer type (``core/ghost/registry.py``) and looked up by the plan."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from lightning_dprobust.core.ghost import plan_rules, register_rule
from lightning_dprobust.core.ghost.conv import Conv1dRule, Conv2dRule
from lightning_dprobust.core.ghost.embedding import EmbeddingRule
from lightning_dprobust.core.ghost.layers import ChannelScaleRule, LayerScaleRule, LinearRule, MaterializedRule
from lightning_dprobust.core.ghost.norms import NormRule
from lightning_dprobust.core.ghost.registry import LAYER_RULES, MODULE_RULES
from lightning_dprobust.core.ghost.tokens import CaiTTokenRule, CrossViTTokenRule, TokenRule


def test_the_closed_forms_are_registered_by_layer_type_and_the_others_by_their_own_test():
    assert LAYER_RULES == {
        nn.Linear: LinearRule,
        nn.Conv2d: Conv2dRule,
        nn.Conv1d: Conv1dRule,
        nn.Embedding: EmbeddingRule,
    }
    assert set(MODULE_RULES) == {
        ChannelScaleRule,
        LayerScaleRule,
        TokenRule,
        CrossViTTokenRule,
        CaiTTokenRule,
        NormRule,
    }


def test_a_layer_type_gets_one_rule():
    with pytest.raises(ValueError, match="Linear already have a ghost rule"):
        register_rule(nn.Linear)(type("OtherLinearRule", (LinearRule,), {}))
    assert LAYER_RULES[nn.Linear] is LinearRule


class Gate(nn.Module):
    """A layer of one's own: ``x * sigmoid(w)`` per channel."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.zeros(channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.sigmoid(self.w)


def test_a_rule_registered_for_a_new_layer_type_is_the_one_the_plan_gives_it():
    model = nn.Sequential(nn.Linear(3, 4), Gate(4))
    rules, _ = plan_rules(model)
    assert [type(rule) for rule in rules] == [LinearRule, MaterializedRule]  # the generic re-run, unregistered

    class GateRule(MaterializedRule):
        @classmethod
        def applies(cls, module: nn.Module, names) -> bool:
            return set(names) == {"w"}

    register_rule(Gate)(GateRule)
    try:
        rules, leftover = plan_rules(model)
        assert [type(rule) for rule in rules] == [LinearRule, GateRule] and not leftover
    finally:
        del LAYER_RULES[Gate]
