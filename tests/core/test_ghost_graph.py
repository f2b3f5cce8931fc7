"""Parameters that get gradient outside their layer's calls: found on the graph, handed to vmap, exact sums."""

from __future__ import annotations

import logging

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from lightning_dprobust.core.ghost import GhostClipper
from lightning_dprobust.core.ghost.graph import sequence_marker
from lightning_dprobust.core.ghost.plan import plan_rules
from lightning_dprobust.core.per_sample import PerExampleClipper
from lightning_dprobust.methods import DPSGD
from tests.core.ghost_checks import without_vmap_checks

pytestmark = pytest.mark.usefixtures("double_precision")


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3, padding=1)
        self.fc1, self.fc2 = nn.Linear(4 * 64, 16), nn.Linear(16, 10)

    def forward(self, x):
        return self.fc2(torch.tanh(self.fc1(torch.tanh(self.conv(x)).flatten(1))))


class WeightPenalty(DPSGD):
    """Each example's loss carries ``lam ||fc1.weight||^2``: gradient to ``fc1.weight`` outside ``fc1``'s call."""

    lam = 1e-3

    def per_example_loss(self, x, y):
        return super().per_example_loss(x, y) + self.lam * self.model.fc1.weight.pow(2).sum()


class WeightOutsideCall(DPSGD):
    """``fc2.weight`` also scales ``fc1``'s input, below ``fc1``'s captured output (inside fc1's input)."""

    def per_example_loss(self, x, y):
        net = self.model
        h = torch.tanh(net.conv(x)).flatten(1) * (1 + net.fc2.weight.mean())
        return F.cross_entropy(net.fc2(torch.tanh(net.fc1(h))), y, reduction="none")


class FunctionalUse(DPSGD):
    """``fc1.weight`` used through ``F.linear`` without calling ``fc1``, with another bias (twice ``fc1``'s): the
    product's output gradient is not that of ``fc1``'s bias, so the product is not captured as a call of ``fc1``
    (``core/ghost/functional.py``)."""

    def per_example_loss(self, x, y):
        net = self.model
        h = F.linear(torch.tanh(net.conv(x)).flatten(1), net.fc1.weight, 2 * net.fc1.bias)
        return F.cross_entropy(net.fc2(torch.tanh(h)), y, reduction="none")


class CalledAndFunctional(DPSGD):
    """``fc1`` called, and its weight also used through ``F.linear`` on another input, with ``fc1``'s bias or with
    none. With the bias, both are calls of ``fc1``'s rule (the second captured on the graph), each counted once;
    without, the product's output gradient is not the bias's, so it is not captured and ``fc1`` goes to vmap."""

    with_bias = True

    def per_example_loss(self, x, y):
        net = self.model
        features = torch.tanh(net.conv(x)).flatten(1)
        bias = net.fc1.bias if self.with_bias else None
        h = net.fc1(features) + F.linear(features.flip(1), net.fc1.weight, bias)
        return F.cross_entropy(net.fc2(torch.tanh(h)), y, reduction="none")


@pytest.mark.parametrize("with_bias", [True, False])
def test_a_layer_both_called_and_used_through_f_linear_stays_exact(with_bias):
    torch.manual_seed(0)
    module = CalledAndFunctional(model=Net(), num_classes=10, input_shape=(1, 8, 8))
    module.with_bias = with_bias
    ghost = assert_equal_to_vmap(module)
    if with_bias:
        assert not ghost.fallback_names and [rule.names["weight"] for rule in ghost._functional] == ["model.fc1.weight"]
    else:
        assert set(ghost.fallback_names) == {"model.fc1.weight", "model.fc1.bias"}


def batch(size: int = 6, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(size, 1, 8, 8, generator=g), torch.randint(0, 10, (size,), generator=g)


def assert_equal_to_vmap(module: nn.Module, bound: float = 0.05) -> GhostClipper:
    inputs = batch()
    expected = PerExampleClipper(module, "per_example_loss", bound)(inputs)
    ghost = GhostClipper(module, "per_example_loss", bound)
    without_vmap_checks(ghost)  # the sums themselves are compared below, not the first-step probe
    actual = ghost(inputs)
    torch.testing.assert_close(actual.norms, expected.norms, rtol=1e-7, atol=1e-10)
    for name, grad in expected.grads.items():
        assert (actual.grads[name] - grad).norm() <= 1e-7 * grad.norm().clamp_min(1e-12), name
    return ghost


@pytest.mark.parametrize(
    ("method", "moved"),
    [
        (WeightPenalty, {"model.fc1.weight", "model.fc1.bias"}),
        (WeightOutsideCall, {"model.fc2.weight", "model.fc2.bias"}),
        (FunctionalUse, {"model.fc1.weight", "model.fc1.bias"}),
    ],
)
def test_parameters_used_outside_their_layer_call_move_to_vmap_and_sums_stay_exact(method, moved, caplog):
    torch.manual_seed(0)
    module = method(model=Net(), num_classes=10, input_shape=(1, 8, 8))
    with caplog.at_level(logging.WARNING):
        ghost = assert_equal_to_vmap(module)
    assert set(ghost.fallback_names) == moved
    assert "outside their layers' calls" in caplog.text


def test_a_penalty_too_small_for_the_first_step_probe_is_still_caught():
    """The probe compares norms to 1e-3; a tiny penalty passes it, yet the sums must match vmap's exactly."""
    torch.manual_seed(0)
    module = WeightPenalty(model=Net(), num_classes=10, input_shape=(1, 8, 8))
    module.lam = 1e-7
    ghost = GhostClipper(module, "per_example_loss", 0.05)
    ghost(batch())  # with the probe on
    assert not ghost._use_reference and "model.fc1.weight" in ghost.fallback_names
    assert_equal_to_vmap(module)


def test_ordinary_models_keep_every_rule():
    torch.manual_seed(0)
    module = DPSGD(model=Net(), num_classes=10, input_shape=(1, 8, 8))
    ghost = assert_equal_to_vmap(module)
    assert not ghost.fallback_names and len(ghost.rules) == 3


class Tied(nn.Module):
    """Two linear layers sharing one weight: the per-example gradient is the sum over both layers' calls."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(64, 64), nn.Linear(64, 64)
        self.b.weight = self.a.weight
        self.head = nn.Linear(64, 10)

    def forward(self, x):
        return self.head(torch.tanh(self.b(torch.tanh(self.a(x.flatten(1))))))


def test_tied_weights_go_to_vmap_and_sums_stay_exact():
    torch.manual_seed(0)
    module = DPSGD(model=Tied(), num_classes=10, input_shape=(1, 8, 8))
    rules, leftover = plan_rules(module)
    assert {"model.a.weight", "model.b.weight"} <= set(leftover)
    assert [type(r).__name__ for r in rules] == ["LinearRule"]
    assert_equal_to_vmap(module)


@pytest.mark.parametrize(("on_mismatch", "vmap_alone"), [("fallback", True), ("raise", False)], ids=["auto", "ghost"])
def test_auto_uses_vmap_alone_after_a_stray_parameter_and_stays_exact(on_mismatch, vmap_alone):
    """engine='auto' runs vmap for every parameter once one is found outside its layer's calls (the fallback's
    per-example pass would cost as much); an explicit ghost engine keeps its other rules."""
    torch.manual_seed(0)
    module = WeightPenalty(model=Net(), num_classes=10, input_shape=(1, 8, 8))
    ghost = GhostClipper(module, "per_example_loss", 0.05, on_mismatch=on_mismatch)
    without_vmap_checks(ghost)
    ghost(batch(seed=1))
    assert ghost._use_reference is vmap_alone and bool(ghost.rules)
    inputs = batch()
    expected = PerExampleClipper(module, "per_example_loss", 0.05)(inputs)
    actual = ghost(inputs)
    torch.testing.assert_close(actual.norms, expected.norms, rtol=1e-7, atol=1e-10)
    for name, grad in expected.grads.items():
        assert (actual.grads[name] - grad).norm() <= 1e-7 * grad.norm().clamp_min(1e-12), name


def test_the_sequence_marker_separates_the_nodes_created_before_it_from_those_after():
    """A call's nodes are those numbered in ``(start marker, output node]``: every node created before the marker is
    numbered at most the marker, every node after it above, and taking the marker creates no node."""
    a = torch.ones(3, requires_grad=True)
    before = (a * 2).grad_fn
    marker = sequence_marker()
    assert sequence_marker() == marker
    after = (a + 1).exp().grad_fn
    first = after.next_functions[0][0]  # the AddBackward of (a + 1)
    assert before._sequence_nr() <= marker < first._sequence_nr() < after._sequence_nr()
