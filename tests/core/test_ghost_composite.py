"""The composite rule: a module that owns parameters and calls sub-layers with parameters of their own (Swin's window
attention and its relative position bias table, ResMLP's blocks and their layer scales) is re-run on each example's
captured arguments; its sub-layers keep their own rules."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from lightning_dprobust.core.ghost import GhostClipper, plan_rules
from lightning_dprobust.core.ghost_functional import BroadcastRule
from lightning_dprobust.core.ghost_layers import CompositeRule
from lightning_dprobust.core.per_sample import PerExampleClipper, clip_factors, per_example_norms
from tests.core.test_ghost_rules import _assert_ghost_equals_vmap

pytestmark = pytest.mark.usefixtures("double_precision")

TOKENS, DIM = 5, 6


class Gated(nn.Module):
    """Owns a per-channel gate between two linear layers, its output being the second layer's (one output edge for
    both calls). ``mask`` (``[TOKENS, DIM]``) is shared by all rows, ``shift`` (``[N, TOKENS, DIM]``) is per row;
    ``leak`` also uses the outer layer's weight outside that layer's call. The gate enters through a sigmoid, a use
    that no graph capture takes (``core/ghost_functional.py``); ``gate="plain"``: a product with the gate itself
    (captured); ``"both"``: the product with the gate, then with its sigmoid."""

    def __init__(self, leak: bool = False, dropout: float = 0.0, gate: str = "sigmoid"):
        super().__init__()
        self.gate = nn.Parameter(torch.linspace(0.5, 1.5, DIM))
        self.inner, self.outer = nn.Linear(DIM, DIM), nn.Linear(DIM, DIM)
        self.drop = nn.Dropout(dropout)
        self.leak, self.gate_use = leak, gate

    def forward(self, x, mask=None, shift=None):
        h = self.drop(torch.tanh(self.inner(x)))
        if self.gate_use in ("plain", "both"):
            h = h * self.gate
        if self.gate_use in ("sigmoid", "both"):
            h = h * torch.sigmoid(self.gate)
        if mask is not None:
            h = h * mask
        if shift is not None:
            h = h + shift
        if self.leak:
            h = h + F.linear(h, self.outer.weight)
        return self.outer(h)


class Net(nn.Module):
    """Token rows ``[N, TOKENS, 4]`` (``views`` scaled copies per example) through a linear layer, ``block`` called
    with the arguments ``call`` names, a mean over tokens and a linear head."""

    def __init__(self, block: nn.Module, call: tuple[str, ...] = (), views: int = 1):
        super().__init__()
        self.embed, self.block, self.head = nn.Linear(4, DIM), block, nn.Linear(DIM, 3)
        self.call, self.views = call, views
        self.register_buffer("mask", torch.linspace(0.0, 2.0, TOKENS * DIM).view(TOKENS, DIM))

    def per_example_loss(self, x, y):
        rows = (
            x.repeat_interleave(self.views, dim=0)
            * torch.linspace(0.5, 1.5, self.views).repeat(x.shape[0])[:, None, None]
        )
        arguments = {"mask": self.mask, "shift": 0.1 * rows.sum(-1, keepdim=True).expand(-1, -1, DIM)}
        h = self.block(self.embed(rows), **{name: arguments[name] for name in self.call})
        logits = self.head(h.mean(1)).view(x.shape[0], self.views, -1).mean(1)
        return F.cross_entropy(logits, y, reduction="none")


def tokens(examples: int = 5) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(7)
    return torch.randn(examples, TOKENS, 4, generator=generator), torch.randint(0, 3, (examples,), generator=generator)


def rule_of(net: nn.Module, module: nn.Module):
    rules, leftover = plan_rules(net)
    return next((rule for rule in rules if rule.module is module), None), leftover


@pytest.mark.parametrize("call", [(), ("mask",), ("mask", "shift")])
@pytest.mark.parametrize("views", [1, 2])
def test_the_composite_rule_equals_the_vmap_engine(call, views, monkeypatch):
    """Positional input, a shared keyword tensor and a per-row keyword tensor (split by example), one or two rows
    per example; the gate's owner ends in a layer with a rule of its own, so their output edges coincide."""
    monkeypatch.setattr(CompositeRule, "MAX_SHARE", 1.0)
    torch.manual_seed(0)
    net = Net(Gated(), call, views)
    rule, leftover = rule_of(net, net.block)
    assert type(rule) is CompositeRule and rule.names == {"gate": "block.gate"} and not leftover
    _assert_ghost_equals_vmap(net, tokens())


def test_a_sub_layers_weight_used_outside_its_call_inside_the_composite_goes_to_vmap(monkeypatch):
    """The graph check follows nested calls: the outer layer's weight reached inside the gate's owner but outside
    the layer's own call is stray, the gate (reached inside its owner's call) is not."""
    monkeypatch.setattr(CompositeRule, "MAX_SHARE", 1.0)
    torch.manual_seed(0)
    net = Net(Gated(leak=True))
    ghost = GhostClipper(net, "per_example_loss", 1.0)
    ghost._verified = True
    ghost(tokens())
    assert set(ghost.fallback_names) == {"block.outer.weight", "block.outer.bias"}
    _assert_ghost_equals_vmap(net, tokens())


class Borrowing(Gated):
    """Also scales its output by another module's gate, which it does not own (held in a list: not a sub-module)."""

    def __init__(self, lender: Gated):
        super().__init__()
        self.lender = [lender]

    def forward(self, x):
        return super().forward(x) * self.lender[0].gate


def test_a_parameter_used_inside_another_composites_call_is_stray(monkeypatch):
    """The walk leaves a call before entering the next: coming down from the second block into the first's output,
    it must not keep the second block's call around the first's, where the second block's gate is used."""
    monkeypatch.setattr(CompositeRule, "MAX_SHARE", 1.0)
    torch.manual_seed(0)
    second = Gated()
    net = Net(nn.Sequential(Borrowing(second), second))
    ghost = GhostClipper(net, "per_example_loss", 1.0)
    ghost._verified = True
    ghost(tokens())
    assert ghost.fallback_names == ["block.1.gate"]
    _assert_ghost_equals_vmap(net, tokens())


@pytest.mark.parametrize("gate", ["plain", "sigmoid", "both"])
def test_a_composite_gives_way_to_graph_captures_of_every_use_of_its_parameters(gate, monkeypatch):
    """The gate as a plain product is captured on the graph at the first forward, and the owner is then not re-run;
    through a sigmoid it is not, nor at every use when used both ways, and the composite rule keeps it. All stay
    equal to the vmap engine, at the first step and at the next (with the rule chosen)."""
    monkeypatch.setattr(CompositeRule, "MAX_SHARE", 1.0)
    torch.manual_seed(0)
    net = Net(Gated(gate=gate), ("mask",))
    inputs = tokens()
    per_example, _ = PerExampleClipper(net, "per_example_loss", 1.0).per_example_gradients(inputs)
    factors = clip_factors(per_example_norms(per_example), 0.5, "flat")
    ghost = GhostClipper(net, "per_example_loss", 0.5)
    ghost._verified = True
    for _ in range(2):
        actual = ghost(inputs)
        for name, grad in per_example.items():
            torch.testing.assert_close(actual.grads[name], torch.einsum("b,b...->...", factors, grad))
    kinds = {type(rule) for rule in ghost.rules if "gate" in rule.names}
    assert kinds == ({BroadcastRule} if gate == "plain" else {CompositeRule}) and not ghost.fallback_names


def test_stochastic_or_large_owners_are_not_re_run(monkeypatch):
    """Dropout inside the owner: a re-run cannot replay its draws. An owner holding more than a quarter of the model's
    parameters: a re-run would cost about what the vmap engine does. Neither is re-run; the gate, a product with a
    branch's output, is captured on the graph instead (``core/ghost_functional.py``), which needs no re-run."""
    net = Net(Gated(dropout=0.5, gate="plain"))
    monkeypatch.setattr(CompositeRule, "MAX_SHARE", 1.0)
    rule, leftover = rule_of(net, net.block)
    assert type(rule) is BroadcastRule and rule.names == {"gate": "block.gate"} and not leftover
    monkeypatch.undo()
    torch.manual_seed(0)
    net = Net(Gated(gate="plain"))
    share = sum(p.numel() for p in net.block.parameters()) / sum(p.numel() for p in net.parameters())
    assert share > CompositeRule.MAX_SHARE
    rule, leftover = rule_of(net, net.block)
    assert type(rule) is BroadcastRule and not leftover
    _assert_ghost_equals_vmap(net, tokens())


class Pair(nn.Module):
    """Owns a scale (used through ``exp``, which no graph capture takes), calls a linear layer, returns two
    tensors."""

    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(DIM))
        self.fc = nn.Linear(DIM, DIM)

    def forward(self, x):
        h = self.fc(x) * self.scale.exp()
        return h, h


class PairNet(Net):
    def per_example_loss(self, x, y):
        h = self.block(self.embed(x))[0]
        return F.cross_entropy(self.head(h.mean(1)), y, reduction="none")


def test_an_owner_that_returns_several_tensors_goes_to_vmap(monkeypatch):
    """A call the rule cannot re-run is not captured: the graph check finds its parameter's gradient outside the
    rule's calls and moves it to the vmap engine, as ``auto`` did before such modules had a rule."""
    monkeypatch.setattr(CompositeRule, "MAX_SHARE", 1.0)
    torch.manual_seed(0)
    net = PairNet(Pair())
    ghost = GhostClipper(net, "per_example_loss", 1.0)
    ghost._verified = True
    ghost(tokens())
    assert ghost.fallback_names == ["block.scale"]
    _assert_ghost_equals_vmap(net, tokens())
