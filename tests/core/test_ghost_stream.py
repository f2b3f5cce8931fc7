"""Streamed layers: per-example gradients formed during the backward, captures dropped, sums still exact."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from lightning_dprobust.core.ghost import GhostClipper, streamed_rules
from lightning_dprobust.core.ghost.clipper import _runs_no_layer
from lightning_dprobust.core.ghost.graph import reaches
from lightning_dprobust.core.ghost.layers import MaterializedRule
from lightning_dprobust.core.ghost.norms import NormRule
from lightning_dprobust.core.ghost.tokens import TokenRule
from lightning_dprobust.core.per_sample import PerExampleClipper
from lightning_dprobust.methods import DPSGD
from tests.core.ghost_checks import without_vmap_checks

pytestmark = pytest.mark.usefixtures("double_precision")


class NormNet(nn.Module):
    """``first`` normalizes the input (nothing below it needs a gradient, so the backward never runs its output
    node: it must keep its captures); ``mid`` is called twice (its per-example gradient sums both calls)."""

    def __init__(self):
        super().__init__()
        self.first = nn.GroupNorm(1, 1)
        self.fc1 = nn.Linear(64, 32)
        self.mid = nn.LayerNorm(32)
        self.fc2 = nn.Linear(32, 10)

    def forward(self, x):
        h = torch.tanh(self.fc1(self.first(x).flatten(1)))
        return self.fc2(self.mid(torch.tanh(self.mid(h))))


def batch(shape: tuple[int, ...], size: int = 6, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(size, *shape, generator=g), torch.randint(0, 10, (size,), generator=g)


def build(model, shape, **kwargs) -> DPSGD:
    torch.manual_seed(0)
    return DPSGD(model=model, num_classes=10, input_shape=shape, model_kwargs=kwargs)


def assert_equal_to_vmap(module: nn.Module, inputs) -> None:
    expected = PerExampleClipper(module, "per_example_loss", 0.05)(inputs)
    ghost = GhostClipper(module, "per_example_loss", 0.05)
    without_vmap_checks(ghost)
    actual = ghost(inputs)
    torch.testing.assert_close(actual.norms, expected.norms, rtol=1e-7, atol=1e-10)
    for name, grad in expected.grads.items():
        assert (actual.grads[name] - grad).norm() <= 1e-7 * grad.norm().clamp_min(1e-12), name


def backward_once(module: nn.Module, inputs) -> GhostClipper:
    ghost = GhostClipper(module, "per_example_loss", 1.0)
    ghost._output_gradients(inputs)
    return ghost


def test_small_layers_stream_and_drop_their_captures_the_first_layer_keeps_them():
    module = build(NormNet(), (1, 8, 8))
    inputs = batch((1, 8, 8))
    ghost = backward_once(module, inputs)
    rules = {rule.module: rule for rule in ghost.rules}
    mid, first = rules[module.model.mid], rules[module.model.first]
    assert len(mid.calls) == 2 and all(call.inputs is None and call.grad is None for call in mid.calls)
    assert set(mid.streamed) == {"weight", "bias"} and mid.streamed["weight"].shape == (6, 32)
    assert first.streamed is None and first.calls[0].grad is not None  # would never be reached by a hook
    assert rules[module.model.fc1].calls[0].grad is not None  # ghost-norm layers keep their captures
    assert_equal_to_vmap(module, inputs)


@pytest.mark.parametrize(
    ("model", "shape", "kwargs"),
    [
        ("timm/resnet18", (3, 32, 32), {}),  # at 32x32 the stem and the patch embedding keep per-example gradients
        ("timm/vit_tiny_patch16_224", (3, 32, 32), {"img_size": 32, "patch_size": 4, "depth": 2}),
    ],
)
def test_norm_layers_and_tokens_of_registry_models_stream(model, shape, kwargs):
    module = build(model, shape, **kwargs)
    inputs = batch(shape, size=3)
    ghost = GhostClipper(module, "per_example_loss", 1.0)
    for rule in ghost.rules:
        rule.reset()
    with ghost._hooks():
        module.per_example_loss(*inputs)
    streamed = streamed_rules(ghost.rules, 3)
    kinds = {type(rule) for rule in streamed}
    assert NormRule in kinds and kinds <= {NormRule, TokenRule}
    if "vit" in model:
        assert TokenRule in kinds
    # every one of them, the lowest included (its input comes from the first layer, whose output gradient is asked for)
    small = [rule for rule in ghost.rules if isinstance(rule, (NormRule, TokenRule)) and rule.calls]
    assert {id(rule) for rule in streamed} == {id(rule) for rule in small}


@pytest.mark.parametrize("model", [NormNet, "timm/resnet18"])
def test_the_nodes_that_reach_a_kept_output_are_the_nodes_the_backward_runs(model):
    """Pre-hooks on every node of the graph fire exactly on the nodes from which :func:`reaches` finds a path to a
    kept layer's output node, whether its ``dead_ends`` are shared between the nodes (in either order) or not."""
    shape = (1, 8, 8) if model is NormNet else (3, 8, 8)
    module = build(model() if model is NormNet else model, shape)
    ghost = GhostClipper(module, "per_example_loss", 1.0)
    with ghost._hooks():
        losses = module.per_example_loss(*batch(shape, size=2))
    kept = [call.edge for rule in ghost.rules if not isinstance(rule, MaterializedRule) for call in rule.calls]
    nodes, stack = [], [losses.grad_fn]
    while stack:
        node = stack.pop()
        if node not in nodes:
            nodes.append(node)
            stack.extend(child for child, _ in node.next_functions if child is not None)
    fired = set()
    handles = [node.register_prehook(lambda grads, node=node: fired.add(node)) for node in nodes]
    torch.autograd.grad(losses.sum(), kept, allow_unused=True)
    for handle in handles:
        handle.remove()
    targets = {edge.node for edge in kept}
    for order in (nodes, nodes[::-1]):
        shared: set = set()
        assert {node for node in order if reaches(node, targets, shared)} == fired
        assert {node for node in order if reaches(node, targets, set())} == fired
    leaf_fed = {node for node in nodes if _runs_no_layer(node)}  # streamed_rules' shortcut, without a walk
    assert leaf_fed and len(fired) < len(nodes) and not leaf_fed & fired


def test_first_step_check_differentiates_one_example_at_a_time():
    """The check against vmap holds one example's gradient at a time, not one per checked example."""
    module = build("timm/resnet18", (3, 8, 8))
    ghost = GhostClipper(module, "per_example_loss", 1.0)
    sizes, onednn = [], []

    def spy(part):
        sizes.append(part[0].shape[0])
        onednn.append(torch.backends.mkldnn.enabled)
        return original(part)

    original = ghost.reference.per_example_gradients
    ghost.reference.per_example_gradients = spy
    ghost(batch((3, 8, 8), size=5))
    assert sizes == [1, 1, 1] and not ghost._use_reference
    # oneDNN is off during the check (no kernels cached for its batch shapes) and on again for the training steps
    assert onednn == [False, False, False] and torch.backends.mkldnn.enabled
