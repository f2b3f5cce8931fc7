"""The composite rule: a module that owns parameters and calls sub-layers with parameters of their own (Swin's window
attention and its relative position bias table, ResMLP's blocks and their layer scales) is re-run on each example's
captured arguments; its sub-layers keep their own rules."""

from __future__ import annotations

import logging
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from lightning_dprobust.core.ghost import EngineMismatch, GhostClipper
from lightning_dprobust.core.ghost.functional import BroadcastRule
from lightning_dprobust.core.ghost.layers import CompositeRule
from lightning_dprobust.core.ghost.plan import plan_rules
from lightning_dprobust.core.per_sample import PerExampleClipper, clip_factors, per_example_norms
from tests.core.ghost_checks import counting_checks, without_vmap_checks
from tests.core.test_ghost_rules import _assert_ghost_equals_vmap

pytestmark = pytest.mark.usefixtures("double_precision")

TOKENS, DIM = 5, 6


class Gated(nn.Module):
    """Owns a per-channel gate between two linear layers, its output being the second layer's (one output edge for
    both calls). ``mask`` (``[TOKENS, DIM]``) is shared by all rows, ``shift`` (``[N, TOKENS, DIM]``) is per row;
    ``leak`` also uses the outer layer's weight outside that layer's call. The gate enters through a sigmoid, a use
    that no graph capture takes (``core/ghost/functional.py``); ``gate="plain"``: a product with the gate itself
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
    without_vmap_checks(ghost)
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
    without_vmap_checks(ghost)
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
    without_vmap_checks(ghost)
    for _ in range(2):
        actual = ghost(inputs)
        for name, grad in per_example.items():
            torch.testing.assert_close(actual.grads[name], torch.einsum("b,b...->...", factors, grad))
    kinds = {type(rule) for rule in ghost.rules if "gate" in rule.names}
    assert kinds == ({BroadcastRule} if gate == "plain" else {CompositeRule}) and not ghost.fallback_names


def test_stochastic_or_large_owners_are_not_re_run(monkeypatch):
    """Dropout inside the owner: a re-run cannot replay its draws. An owner holding more than a quarter of the model's
    parameters: a re-run would cost about what the vmap engine does. Neither is re-run; the gate, a product with a
    branch's output, is captured on the graph instead (``core/ghost/functional.py``), which needs no re-run."""
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
    without_vmap_checks(ghost)
    ghost(tokens())
    assert ghost.fallback_names == ["block.scale"]
    _assert_ghost_equals_vmap(net, tokens())


class BiasTable(nn.Module):
    """A table read through a method, never called (timm's ``RelPosBias.get_bias()`` in CoAtNet and MaxViT)."""

    def __init__(self):
        super().__init__()
        self.table = nn.Parameter(torch.linspace(-1.0, 1.0, TOKENS * DIM).view(TOKENS, DIM))

    def bias(self):
        return torch.tanh(self.table)


class CoordinateMlp(nn.Module):
    """A bias from a linear layer on a coordinate table all rows share (MaxViT-RMLP's, without its dropout)."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(2, DIM)
        self.register_buffer("coordinates", torch.linspace(0.0, 1.0, TOKENS * 2).view(TOKENS, 2))

    def bias(self):
        return torch.tanh(self.fc(self.coordinates))


class Biased(nn.Module):
    """A linear layer on the rows plus a bias that no call of the bias's own module gives on the rows; ``outside``:
    the bias is also added after the block's call (by :class:`BiasedTwice`)."""

    def __init__(self, source: nn.Module, dropout: float = 0.0):
        super().__init__()
        self.proj, self.source, self.drop = nn.Linear(DIM, DIM), source, nn.Dropout(dropout)

    def forward(self, x):
        return self.drop(self.proj(x) + self.source.bias())


class BiasedTwice(nn.Module):
    def __init__(self, block: Biased):
        super().__init__()
        self.block = block

    def forward(self, x):
        return self.block(x) + self.block.source.bias()


def _ghost_equals_vmap_from_the_first_step(net: nn.Module) -> GhostClipper:
    """Two steps of a fresh ghost engine, its first-step check included (the re-planning happens there), each equal
    to the vmap engine's norms and clipped sum."""
    inputs = tokens()
    per_example, _ = PerExampleClipper(net, "per_example_loss", 1.0).per_example_gradients(inputs)
    norms = per_example_norms(per_example)
    bound = float(norms.median())
    factors = clip_factors(norms, bound, "flat")
    ghost = GhostClipper(net, "per_example_loss", bound)
    for _ in range(2):
        actual = ghost(inputs)
        torch.testing.assert_close(actual.norms, norms, rtol=1e-10, atol=1e-12)
        for full, grad in per_example.items():
            torch.testing.assert_close(actual.grads[full], torch.einsum("b,b...->...", factors, grad))
    return ghost


@pytest.mark.parametrize("source", [BiasTable, CoordinateMlp])
def test_parameters_no_call_of_their_own_covers_are_re_run_with_their_nearest_called_ancestor(source, monkeypatch):
    """Never called (the table), or called on rows that are not the examples' (the shared coordinates): the block
    that holds them and a layer on the examples' rows is re-run per example for them, with no vmap fallback."""
    monkeypatch.setattr(CompositeRule, "MAX_SHARE", 1.0)
    torch.manual_seed(0)
    net = Net(Biased(source()))
    ghost = _ghost_equals_vmap_from_the_first_step(net)
    assert not ghost.fallback_names and not ghost._use_reference
    rule = next(rule for rule in ghost.rules if rule.module is net.block)
    assert type(rule) is CompositeRule
    assert set(rule.names.values()) == {name for name, _ in net.block.source.named_parameters(prefix="block.source")}


@pytest.mark.parametrize("source", [BiasTable, CoordinateMlp])
def test_a_re_run_ancestor_that_misses_a_use_or_draws_randomness_leaves_the_parameters_to_vmap(source, monkeypatch):
    """The bias used after the block's call too (the graph check finds that use outside the re-run block's calls),
    or a block with dropout (its re-runs cannot replay the draws): the source's parameters go to the vmap engine."""
    monkeypatch.setattr(CompositeRule, "MAX_SHARE", 1.0)
    for block in (BiasedTwice(Biased(source())), Biased(source(), dropout=0.5)):
        torch.manual_seed(0)
        net = Net(block).eval()
        ghost = _ghost_equals_vmap_from_the_first_step(net)
        source_names = {name for name, p in net.named_parameters() if "source." in name}
        assert set(ghost.fallback_names) == source_names


class Switched(Biased):
    """:class:`Biased` whose bias is added only once ``on`` is set: a path that a later step takes first."""

    def __init__(self, source: nn.Module):
        super().__init__(source)
        self.on = False

    def forward(self, x):
        return super().forward(x) if self.on else self.drop(self.proj(x))


def _switched_on_after_a_checked_step(
    block: Callable[[], nn.Module], monkeypatch, **options
) -> tuple[Net, GhostClipper, list[int]]:
    """A net around ``block()`` (``on`` off), a ghost engine (``options``: its arguments) after one checked step, and
    the batch sizes of its checks (counted from that step on); ``on`` is then set."""
    monkeypatch.setattr(CompositeRule, "MAX_SHARE", 1.0)
    torch.manual_seed(0)
    net = Net(block())
    ghost = GhostClipper(net, "per_example_loss", 1.0, **options)
    checks = counting_checks(ghost, monkeypatch)
    ghost(tokens())
    net.block.on = True
    return net, ghost, checks


@pytest.mark.parametrize("source", [BiasTable, CoordinateMlp])
def test_a_layer_first_used_after_the_first_step_is_checked_against_the_vmap_engine(source, monkeypatch):
    """The bias source enters the loss at the second step only. The table is then handed to the block's re-run; the
    coordinate layer is called on 5 shared rows in a batch of 5 examples, rows that pass for the examples' (one
    each) and would give wrong norms. Either way the step's new layers are compared with the vmap engine on that
    step, as the first step's were, and the step's result is the block re-run's, equal to the vmap engine's."""
    net, ghost, checks = _switched_on_after_a_checked_step(lambda: Switched(source()), monkeypatch)
    assert checks == [5]
    inputs = tokens()
    per_example, _ = PerExampleClipper(net, "per_example_loss", 1.0).per_example_gradients(inputs)
    norms = per_example_norms(per_example)
    factors = clip_factors(norms, 1.0, "flat")
    for _ in range(2):  # checked at the first of these steps only
        actual = ghost(inputs)
        assert checks == [5, 5]
        torch.testing.assert_close(actual.norms, norms, rtol=1e-10, atol=1e-12)
        for full, grad in per_example.items():
            torch.testing.assert_close(actual.grads[full], torch.einsum("b,b...->...", factors, grad))
    assert not ghost.fallback_names and not ghost._use_reference
    rule = next(rule for rule in ghost.rules if rule.module is net.block)
    assert type(rule) is CompositeRule and any("source" in name for name in rule.names.values())


def test_a_layer_first_used_after_the_first_step_that_differs_from_the_vmap_engine_stops_training(monkeypatch):
    """A fault in the rule added at the second step (its per-example gradients doubled) is found on that step: the
    engine raises by default, and with ``on_mismatch="fallback"`` that step's result is the vmap engine's."""
    monkeypatch.setattr(CompositeRule, "MAX_SHARE", 1.0)
    gradients = CompositeRule.gradients_of
    monkeypatch.setattr(CompositeRule, "gradients_of", lambda *args: {k: 2 * g for k, g in gradients(*args).items()})
    inputs = tokens()
    for on_mismatch in ("raise", "fallback"):
        net, ghost, _ = _switched_on_after_a_checked_step(
            lambda: Switched(BiasTable()), monkeypatch, on_mismatch=on_mismatch
        )
        if on_mismatch == "raise":
            with pytest.raises(EngineMismatch, match="differ from the vmap engine's"):
                ghost(inputs)
            continue
        expected = PerExampleClipper(net, "per_example_loss", 1.0)(inputs)
        actual = ghost(inputs)
        assert ghost._use_reference
        torch.testing.assert_close(actual.norms, expected.norms, rtol=1e-10, atol=1e-12)


class TrainingOnly(nn.Module):
    """A linear layer on the rows, and a second one added in training mode once ``on`` is set."""

    def __init__(self):
        super().__init__()
        self.proj, self.extra = nn.Linear(DIM, DIM), nn.Linear(DIM, DIM)
        self.on = False

    def forward(self, x):
        return self.proj(x) + self.extra(x) if self.on and self.training else self.proj(x)


def test_a_layer_first_used_at_a_later_step_in_training_mode_only_is_compared_by_the_check(monkeypatch, caplog):
    """The check runs in the mode the model trains in, so a layer the training-mode forward alone calls is compared
    with the vmap engine like any other: no layer is left to the structural checks alone."""
    net, ghost, checks = _switched_on_after_a_checked_step(TrainingOnly, monkeypatch)
    expected = PerExampleClipper(net, "per_example_loss", 1.0)(tokens())
    for _ in range(2):
        with caplog.at_level(logging.WARNING, logger="lightning_dprobust.core.ghost"):
            actual = ghost(tokens())
        torch.testing.assert_close(actual.norms, expected.norms, rtol=1e-10, atol=1e-12)
    assert checks == [5, 5]
    assert not [record for record in caplog.records if "cannot compare" in record.getMessage()]


def test_a_batch_of_one_example_that_first_uses_a_layer_is_the_vmap_engines_and_the_check_waits(monkeypatch):
    """One example cannot show rows laid out otherwise than by example: as at the first step, that step's result is
    the vmap engine's, and the comparison runs at the next batch of two examples or more."""
    net, ghost, checks = _switched_on_after_a_checked_step(lambda: Switched(CoordinateMlp()), monkeypatch)
    reference = PerExampleClipper(net, "per_example_loss", 1.0)
    one = tuple(t[:1] for t in tokens())
    torch.testing.assert_close(ghost(one).norms, reference(one).norms, rtol=1e-10, atol=1e-12)
    assert checks == [5]
    torch.testing.assert_close(ghost(tokens()).norms, reference(tokens()).norms, rtol=1e-10, atol=1e-12)
    assert checks == [5, 5]
