"""The ghost engine follows the trainable parameters: a parameter frozen or unfrozen after the engine was built, or
a module replaced, gets the rules planned again, and the norms and clipped sums stay the vmap engine's."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from lightning_dprobust.core.engines import build_clipper
from lightning_dprobust.core.ghost import GhostClipper
from lightning_dprobust.core.per_sample import PerExampleClipper
from lightning_dprobust.methods import DPSGD
from tests.core.ghost_checks import counting_checks

pytestmark = pytest.mark.usefixtures("double_precision")


def _batch(examples: int = 6) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(3)
    return torch.rand(examples, 1, 28, 28, generator=generator), torch.randint(0, 10, (examples,), generator=generator)


def _assert_equals_vmap(ghost: GhostClipper, module: nn.Module) -> None:
    expected = PerExampleClipper(module, "per_example_loss", ghost.max_grad_norm)(_batch())
    actual = ghost(_batch())
    assert list(actual.grads) == list(expected.grads)
    torch.testing.assert_close(actual.norms, expected.norms, rtol=1e-10, atol=1e-12)
    for name, grad in expected.grads.items():
        torch.testing.assert_close(actual.grads[name], grad, rtol=1e-10, atol=1e-12)


@pytest.fixture
def module() -> DPSGD:
    torch.manual_seed(0)
    return DPSGD(model="cnn_tanh", num_classes=10, input_shape=(1, 28, 28))


def test_layers_unfrozen_after_the_engine_was_built_are_clipped_and_summed(module, monkeypatch):
    """A backbone frozen when the engine was built and unfrozen later (Lightning's ``BackboneFinetuning``): its
    parameters used to get zero sums (trained on noise alone) and no share of the norms."""
    for p in module.model.net.parameters():
        p.requires_grad_(False)
    module.model.net.fc2.requires_grad_(True)
    ghost = GhostClipper(module, "per_example_loss", 0.5)
    checks = counting_checks(ghost, monkeypatch)
    _assert_equals_vmap(ghost, module)
    module.model.net.requires_grad_(True)
    _assert_equals_vmap(ghost, module)
    assert checks == [6, 6]  # the new plan is checked against the vmap engine, as the first one was
    assert {name for rule in ghost.rules for name in rule.names.values()} >= {"model.net.conv1.weight"}


def test_layers_frozen_after_the_engine_was_built_leave_the_norms_and_sums(module):
    ghost = GhostClipper(module, "per_example_loss", 0.5)
    _assert_equals_vmap(ghost, module)
    module.model.net.conv1.requires_grad_(False)
    _assert_equals_vmap(ghost, module)
    assert not any("conv1" in name for rule in ghost.rules for name in rule.names.values())


def test_a_layer_replaced_after_the_engine_was_built_is_clipped_and_summed(module):
    """Same names, new tensors: the rules held the old layer, whose calls never came; the new layer's parameters
    reach the loss through no rule's call and used to get zero sums."""
    ghost = GhostClipper(module, "per_example_loss", 0.5)
    _assert_equals_vmap(ghost, module)
    module.model.net.fc2 = nn.Linear(module.model.net.fc2.in_features, 10)
    _assert_equals_vmap(ghost, module)


class TiedLayers(nn.Module):
    """Two linear layers sharing one weight: no layer rule can give its per-example gradient (the sum over both
    layers' calls), so while it is trainable, it and its owners' other parameters get theirs from the vmap engine."""

    def __init__(self):
        super().__init__()
        self.embed, self.first, self.second = nn.Linear(28 * 28, 16), nn.Linear(16, 16), nn.Linear(16, 16)
        self.second.weight = self.first.weight
        self.head = nn.Linear(16, 10)

    def forward(self, x):
        return self.head(self.second(torch.tanh(self.first(torch.tanh(self.embed(x.flatten(1)))))))


def test_under_auto_a_parameter_unfrozen_later_without_a_rule_runs_the_vmap_engine_alone():
    """``auto`` picks the ghost engine only when every parameter has a rule; once an unfrozen parameter has none, it
    runs the vmap engine for every parameter, as it does when a step finds a parameter no rule covers."""
    torch.manual_seed(0)
    module = DPSGD(model=TiedLayers(), num_classes=10, input_shape=(1, 28, 28))
    tied = next(name for name, _ in module.named_parameters() if name.endswith("first.weight"))
    module.get_parameter(tied).requires_grad_(False)
    ghost, choice = build_clipper("auto", module, "per_example_loss", 0.5)
    assert isinstance(ghost, GhostClipper) and choice.startswith("ghost")
    _assert_equals_vmap(ghost, module)
    assert not ghost._use_reference
    module.get_parameter(tied).requires_grad_(True)
    _assert_equals_vmap(ghost, module)
    assert tied in ghost.fallback_names and ghost._use_reference
