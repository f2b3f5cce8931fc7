"""The closed-form normalization and embedding rules and every convolution route and kernel agree with the vmap
engine."""

from __future__ import annotations

import logging

import pytest
import torch
import torch.nn.functional as F
from timm.layers import GroupNorm1, GroupNormAct, LayerNorm, LayerNorm2d, LayerScale, LayerScale2d
from timm.models.metaformer import MetaFormerBlock, Scale
from torch import nn

from lightning_dprobust import models
from lightning_dprobust.core.ghost import GhostClipper
from lightning_dprobust.core.ghost import conv as ghost_conv
from lightning_dprobust.core.ghost.conv import Conv1dRule, Conv2dRule
from lightning_dprobust.core.ghost.embedding import EmbeddingRule
from lightning_dprobust.core.ghost.functional import BroadcastRule
from lightning_dprobust.core.ghost.layers import (
    ChannelScaleRule,
    LayerScaleRule,
    LinearRule,
    MaterializedRule,
    example_rows,
    frobenius_products,
    split_rows,
    squared_norms,
)
from lightning_dprobust.core.ghost.norms import NormRule, norm_kind
from lightning_dprobust.core.ghost.plan import plan_rules
from lightning_dprobust.core.per_sample import PerExampleClipper, clip_factors, per_example_norms
from tests.core.ghost_checks import without_vmap_checks
from tests.core.test_ghost import CAIT_KWARGS, CROSSVIT_KWARGS, GRAPH_CAPTURED, MODELS, SWIN_KWARGS

pytestmark = pytest.mark.usefixtures("double_precision")

NORMS = {
    "groupnorm_2d": (lambda: nn.GroupNorm(2, 4), (3, 4, 5, 5)),
    "groupnorm_1d": (lambda: nn.GroupNorm(4, 4), (3, 4, 7)),
    "groupnorm_act": (lambda: GroupNormAct(4, num_groups=2, apply_act=False), (3, 4, 5, 5)),
    "layernorm_tokens": (lambda: nn.LayerNorm(6), (3, 5, 6)),
    "layernorm_two_dims": (lambda: nn.LayerNorm((5, 6)), (3, 5, 6)),
    "layernorm_no_bias": (lambda: nn.LayerNorm(6, bias=False), (3, 6)),
    "timm_layernorm": (lambda: LayerNorm(6), (3, 2, 6)),
    "timm_layernorm2d": (lambda: LayerNorm2d(4), (3, 4, 2, 3)),  # the channels of each position of NCHW maps
    "timm_groupnorm1": (lambda: GroupNorm1(4), (3, 4, 2, 3)),  # PoolFormer's
}


def _randomized(module: nn.Module) -> nn.Module:
    """Affine parameters away from (1, 0), so that a wrong formula cannot hide behind the identity."""
    torch.manual_seed(0)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn_like(p))
    return module


SCALES = {
    "layer_scale_tokens": (lambda: LayerScale(6), (3, 5, 6)),  # ViT blocks with init_values
    "layer_scale_2d": (lambda: LayerScale2d(4), (3, 4, 2, 3)),
    "metaformer_scale_nchw": (lambda: Scale(4), (3, 4, 2, 3)),
    "metaformer_scale_channels_last": (lambda: Scale(6, use_nchw=False), (3, 2, 5, 6)),
}
CLOSED_FORMS = {name: (NormRule, *case) for name, case in NORMS.items()}
CLOSED_FORMS |= {name: (ChannelScaleRule, *case) for name, case in SCALES.items()}


@pytest.mark.parametrize("name", list(CLOSED_FORMS))
@pytest.mark.parametrize("rows_per_example", [1, 2])
def test_closed_form_per_example_gradients_equal_the_generic_rule(name, rows_per_example):
    rule, build, shape = CLOSED_FORMS[name]
    module = _randomized(build())
    assert rule.supports(module)
    names = {local: local for local, _ in module.named_parameters()}
    generator = torch.Generator().manual_seed(1)
    inputs = torch.randn(shape[0] * rows_per_example, *shape[1:], generator=generator)
    grad = torch.randn_like(inputs)
    ours = rule(module, names).call_gradients(inputs, grad, shape[0])
    reference = MaterializedRule(module, names).call_gradients(inputs, grad, shape[0])
    assert ours.keys() == reference.keys() == names.keys()
    for local, expected in reference.items():
        torch.testing.assert_close(ours[local], expected, rtol=1e-10, atol=1e-12)


def test_an_in_place_layer_scale_goes_to_the_vmap_engine_and_stays_exact():
    """``inplace=True`` overwrites the input a rule would capture (a re-run of the layer would too): no layer rule
    takes its scale. The graph capture (``core/ghost/functional.py``) finds no product node there either (the
    in-place product of a view is a ``CopySlices``), so the scale goes to the vmap engine at the first step, with the
    linear layer whose output it overwrote."""
    torch.manual_seed(0)
    net = Tokens(nn.Linear(3, 4), 3)
    net.linear = nn.Sequential(net.linear, LayerScale(4, init_values=0.5, inplace=True))
    rules, leftover = plan_rules(net)
    planned = [rule for rule in rules if isinstance(rule.module, LayerScale)]
    assert not leftover and [type(rule) for rule in planned] == [BroadcastRule]
    ghost = _assert_ghost_equals_vmap(Wrapper(net, 1), (torch.randn(5, 1, 3, 3), torch.randint(0, 3, (5,))))
    assert "net.linear.1.gamma" in ghost.fallback_names


class MetaFormerNet(nn.Module):
    """A stem, one timm ``MetaFormerBlock`` as in PoolFormer (``GroupNorm1``, layer and residual ``Scale``s,
    ``StarReLU``), a head."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(2, 8, 3)
        self.block = MetaFormerBlock(8, norm_layer=GroupNorm1, layer_scale_init_value=0.5, res_scale_init_value=0.7)
        self.head = nn.Linear(8 * 3 * 3, 3)

    def forward(self, x):
        return self.head(self.block(self.stem(x)).flatten(1))


@pytest.mark.parametrize("views", [1, 2])
def test_a_poolformer_block_equals_the_vmap_engine(views):
    torch.manual_seed(0)
    module = Wrapper(_randomized(MetaFormerNet()), views)
    kinds = {type(rule) for rule in plan_rules(module)[0]}
    assert {ChannelScaleRule, NormRule} <= kinds
    generator = torch.Generator().manual_seed(9)
    _assert_ghost_equals_vmap(module, (torch.randn(5, 2, 5, 5, generator=generator), torch.randint(0, 3, (5,))))


@pytest.mark.parametrize(
    "module",
    [
        type("Scaled", (nn.GroupNorm,), {"forward": lambda self, x: 2 * super(type(self), self).forward(x)})(2, 4),
    ],
    ids=["subclass"],
)
def test_layers_outside_the_closed_form_keep_the_generic_rule(module):
    assert norm_kind(module) is None
    rules, leftover = plan_rules(module)
    assert [type(rule) for rule in rules] == [MaterializedRule] and not leftover


class NormAct(nn.Module):
    """A convolution, a timm ``GroupNormAct`` (its output gradient taken at its ``drop`` module's input), a head."""

    def __init__(self, norm: nn.Module):
        super().__init__()
        self.conv, self.norm, self.head = nn.Conv2d(2, 4, 3), norm, nn.Linear(4 * 3 * 3, 3)

    def forward(self, x):
        return self.head(self.norm(self.conv(x)).flatten(1))


ACTIVATED_NORMS = {
    "relu_in_place": lambda: GroupNormAct(4, num_groups=2),  # timm's default activation, in place
    "silu": lambda: GroupNormAct(4, num_groups=2, act_layer=nn.SiLU, inplace=False),
    "hardswish_frozen_weight": lambda: GroupNormAct(4, num_groups=2, act_layer=nn.Hardswish).requires_grad_(False),
    "gelu_tanh_dropout": lambda: GroupNormAct(4, num_groups=2, act_layer="gelu_tanh", drop_layer=nn.Dropout),
    "prelu": lambda: GroupNormAct(4, num_groups=2, act_layer=nn.PReLU),  # an activation with its own parameter
    "softmax": lambda: GroupNormAct(4, num_groups=2, act_layer=nn.Softmax),  # not elementwise
}


@pytest.mark.parametrize("name", list(ACTIVATED_NORMS))
@pytest.mark.parametrize("views", [1, 2])
def test_a_norm_with_an_activation_after_it_equals_the_vmap_engine(name, views):
    """The closed form needs the gradient at the affine map's output, before timm ``GroupNormAct``'s dropout and
    activation (in place or not, with parameters or not, elementwise or not); in eval mode, as dropout draws."""
    torch.manual_seed(0)
    norm = _randomized(ACTIVATED_NORMS[name]())
    if name == "hardswish_frozen_weight":
        norm.bias.requires_grad_(True)
    module = Wrapper(NormAct(norm), views).eval()
    assert NormRule in {type(rule) for rule in plan_rules(module)[0]}
    generator = torch.Generator().manual_seed(6)
    _assert_ghost_equals_vmap(module, (torch.randn(5, 2, 5, 5, generator=generator), torch.randint(0, 3, (5,))))


def test_fast_norm_layers_keep_the_generic_rule():
    layer = LayerNorm(6)
    layer._fast_norm = True
    assert norm_kind(layer) is None


@pytest.mark.parametrize("shape", [(5,), (5, 3), (5, 2, 3, 4)])
def test_per_example_helpers_read_any_layout(shape):
    """Squared norms per example, and weighted sums through the side-by-side rows of several gradients, for a scalar
    parameter's ``[B]`` gradients and for permuted views (as the batched products of channels-last inputs return),
    equal those of plain contiguous copies, each gradient's sum in its own shape and dtype."""
    generator = torch.Generator().manual_seed(5)
    dense = torch.randn(*shape[:1], *reversed(shape[1:]), generator=generator)
    per_example = dense.permute(0, *range(dense.dim() - 1, 0, -1))  # shape ``shape``, not contiguous beyond 2 dims
    weights = torch.rand(shape[0], generator=generator)
    expected_norms = per_example.contiguous().reshape(shape[0], -1).square().sum(1)
    torch.testing.assert_close(squared_norms(per_example), expected_norms, rtol=1e-12, atol=0)
    grads = {"a": per_example, "scalar": torch.randn(shape[0], generator=generator), "b": per_example.flip(0)}
    rows = example_rows(grads, shape[0])
    torch.testing.assert_close(rows.square().sum(1), sum(squared_norms(g) for g in grads.values()))
    totals = split_rows(weights @ rows, grads)
    assert list(totals) == list(grads)
    for name, g in grads.items():
        assert totals[name].shape == g.shape[1:] and totals[name].dtype == g.dtype
        torch.testing.assert_close(totals[name], torch.einsum("b,b...->...", weights, g.contiguous()))


NEEDS_CUDA = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]
DEVICES = ["cpu", pytest.param("cuda", marks=NEEDS_CUDA)]


@pytest.mark.parametrize("device", DEVICES)
def test_frobenius_products_are_each_examples_inner_product(device):
    """The ghost norm's ``<A A^T, G G^T>`` per example: each device's route (CPU: product and sum; CUDA: one batched
    product) gives every example's own inner product, never another example's."""
    generator = torch.Generator().manual_seed(6)
    x, y = (torch.randn(4, 7, 7, generator=generator, dtype=torch.float64) for _ in range(2))
    expected = torch.stack([(x[i] * y[i]).sum() for i in range(4)])
    torch.testing.assert_close(frobenius_products(x.to(device), y.to(device)).cpu(), expected, rtol=1e-12, atol=0)


class Convs(nn.Module):
    """One convolution called ``calls`` times on ``views`` rows per example, then a linear head."""

    def __init__(self, conv: nn.Conv2d, size: int, calls: int = 1, channels_last: bool = False):
        super().__init__()
        self.conv, self.calls, self.channels_last = conv, calls, channels_last
        out = torch.zeros(1, conv.in_channels, size, size)
        for _ in range(calls):
            out = conv(out)
        self.head = nn.Linear(out[0].numel(), 3)

    def forward(self, x):
        h = models.cnn.channels_last(x) if self.channels_last else x
        for _ in range(self.calls):
            h = torch.tanh(self.conv(h))
        return self.head(h.flatten(1))


class Wrapper(nn.Module):
    """``views`` rows per example (scaled copies of its input, of any rank), logits averaged over them."""

    def __init__(self, net: nn.Module, views: int = 1):
        super().__init__()
        self.net, self.views = net, views

    def per_example_loss(self, x, y):
        scales = torch.linspace(0.5, 1.5, self.views).repeat(x.shape[0])
        rows = x.repeat_interleave(self.views, dim=0) * scales.view(-1, *[1] * (x.dim() - 1))
        logits = self.net(rows).view(x.shape[0], self.views, -1).mean(1)
        return F.cross_entropy(logits, y, reduction="none")


# (conv, input size, route): ghost when T (d + p) < d p; kept when B (d p + p) <= captures.
CONVS = {
    "ghost": (lambda: nn.Conv2d(16, 64, 3, stride=2, padding=1), 4, "ghost"),
    "ghost_strided_dilated": (
        lambda: nn.Conv2d(8, 128, (3, 2), stride=(2, 1), padding=(2, 1), dilation=(2, 1)),
        3,
        "ghost",
    ),
    "kept": (lambda: nn.Conv2d(1, 2, 3, padding=1), 6, "kept"),
    "kept_one_channel_strided": (lambda: nn.Conv2d(1, 4, 8, stride=2, padding=3), 12, "kept"),  # cnn_tanh's first
    "kept_strided_dilated": (
        lambda: nn.Conv2d(3, 4, (3, 2), stride=2, padding=(1, 2), dilation=(2, 1)),
        9,
        "kept",
    ),
    "kept_many_channels": (lambda: nn.Conv2d(4, 2, 3, padding=1), 6, "kept"),
    "dropped_few_channels": (lambda: nn.Conv2d(3, 64, 3, padding=1), 5, "dropped"),
    "dropped": (lambda: nn.Conv2d(16, 16, 3, padding=1), 4, "dropped"),
    "dropped_no_bias": (lambda: nn.Conv2d(16, 16, 3, padding=1, bias=False), 4, "dropped"),
    "grouped_kept": (lambda: nn.Conv2d(4, 6, 3, padding=1, groups=2), 5, "kept"),
    "depthwise_kept": (lambda: nn.Conv2d(4, 4, 3, padding=1, groups=4), 5, "kept"),
    "depthwise_multiplier_strided_dilated": (
        lambda: nn.Conv2d(3, 6, (3, 2), stride=2, padding=(2, 1), dilation=(2, 1), groups=3),
        7,
        "kept",
    ),
    "grouped_dropped": (lambda: nn.Conv2d(8, 16, 3, padding=1, groups=2, bias=False), 2, "dropped"),
    "depthwise_multiplier_dropped": (lambda: nn.Conv2d(8, 16, 3, padding=1, groups=8), 1, "dropped"),
    "depthwise_multiplier_dropped_2x2": (lambda: nn.Conv2d(4, 8, 5, stride=(1, 2), padding=2, groups=4), 2, "dropped"),
}


def _convolution_case(build, calls: int, kernels: str, monkeypatch) -> nn.Module:
    """The case's convolution (for two calls, one from its output channels to themselves) with the CPU kernels that
    ``kernels`` names: per-example gradients formed one example at a time and joined (``*chunks``), every clipped sum
    by the matrix product or the weight-gradient convolution, from the captured inputs (``*_sums``)."""
    torch.manual_seed(0)
    conv = build()
    if calls == 2 and conv.in_channels != conv.out_channels:
        conv = type(conv)(conv.out_channels, conv.out_channels, conv.kernel_size, conv.stride, conv.padding)
    if kernels.endswith("chunks"):
        monkeypatch.setattr(ghost_conv, "CPU_CHUNK_VALUES", 1)
    if kernels.endswith("sums"):
        monkeypatch.setattr(ghost_conv, "CPU_PRODUCT_SUM_POSITIONS", 10**6 if kernels == "product_sums" else 0)
        monkeypatch.setattr(ghost_conv, "CPU_HELD_PATCHES", 0)
    return conv


def _route(rule: Conv2dRule, examples: int) -> str:
    if rule.keeps_per_example(examples):
        return "kept"
    return "dropped" if rule._materializes(examples) else "ghost"


@pytest.mark.parametrize("name", list(CONVS))
@pytest.mark.parametrize(("views", "calls"), [(1, 1), (2, 1), (1, 2)])
@pytest.mark.parametrize(
    "kernels",
    [
        "cpu",
        "one_example_chunks",
        "channels_last",
        "channels_last_chunks",
        "product_sums",
        "convolution_sums",
    ],
)
def test_each_convolution_route_equals_the_vmap_engine(name, views, calls, kernels, monkeypatch):
    build, size, route = CONVS[name]
    conv = _convolution_case(build, calls, kernels, monkeypatch)
    # channels-last: captures stored channels-last (their patches are copied without a layout change)
    module = Wrapper(Convs(conv, size, calls, kernels.startswith("channels_last")), views)
    generator = torch.Generator().manual_seed(2)
    x = torch.randn(5, conv.in_channels, size, size, generator=generator)
    inputs = (x, torch.randint(0, 3, (5,), generator=generator))
    if calls == 1 and views == 1:
        probe = GhostClipper(module, "per_example_loss", 1.0)
        probe._output_gradients(inputs)
        assert _route(next(rule for rule in probe.rules if isinstance(rule, Conv2dRule)), 5) == route
    _assert_ghost_equals_vmap(module, inputs)


@pytest.mark.parametrize(("held", "ratio"), [(True, ghost_conv.CPU_HELD_PATCHES), (False, 1)])
def test_a_ghost_layer_holds_its_patches_for_the_sum_only_within_the_memory_bound(held, ratio, monkeypatch):
    """``CONVS["ghost"]``'s patches hold 1.125 times the values of its captures: within the default bound they are
    kept from the norm to the clipped sum and the captured inputs dropped; under a bound of 1 the inputs stay, and
    the patches go. A step that fails between the norms and the sum leaves nothing to the next one."""
    monkeypatch.setattr(ghost_conv, "CPU_HELD_PATCHES", ratio)
    build, size, _ = CONVS["ghost"]
    torch.manual_seed(0)
    module = Wrapper(Convs(build(), size), 1)
    inputs = (torch.randn(5, 16, size, size), torch.randint(0, 3, (5,)))
    clipper = GhostClipper(module, "per_example_loss", 1.0)
    clipper._output_gradients(inputs)
    rule = next(rule for rule in clipper.rules if isinstance(rule, Conv2dRule))
    rule.sq_norms(5)
    assert (rule._cache is not None) is held
    assert all((call.inputs is None) is held for call in rule.calls)
    clipper._output_gradients(inputs)  # the next forward, as after an error before the clipped sum
    assert rule._cache is None
    _assert_ghost_equals_vmap(module, inputs)


def _assert_ghost_equals_vmap(module: nn.Module, inputs: tuple[torch.Tensor, ...]) -> GhostClipper:
    """The ghost engine's norms and clipped sums equal the vmap engine's (bound: the median norm, so that some
    examples are clipped and some not)."""
    per_example, _ = PerExampleClipper(module, "per_example_loss", 1.0).per_example_gradients(inputs)
    norms = per_example_norms(per_example)
    bound = float(norms.median())
    factors = clip_factors(norms, bound, "flat")
    ghost = GhostClipper(module, "per_example_loss", bound)
    without_vmap_checks(ghost)
    actual = ghost(inputs)
    torch.testing.assert_close(actual.norms, norms, rtol=1e-10, atol=1e-12)
    for full, grad in per_example.items():
        expected = torch.einsum("b,b...->...", factors, grad)
        torch.testing.assert_close(actual.grads[full], expected, rtol=1e-10, atol=1e-12)
    return ghost


class Sequences(nn.Module):
    """A ``nn.Conv1d`` called ``calls`` times on each row's ``[C, H, W]`` image read as a sequence ``[C, H W]``, then a
    linear head."""

    def __init__(self, conv: nn.Conv1d, size: int, calls: int = 1):
        super().__init__()
        self.conv, self.calls = conv, calls
        out = torch.zeros(1, conv.in_channels, size * size)
        for _ in range(calls):
            out = conv(out)
        self.head = nn.Linear(out[0].numel(), 3)

    def forward(self, x):
        h = x.flatten(2)
        for _ in range(self.calls):
            h = torch.tanh(self.conv(h))
        return self.head(h.flatten(1))


# (conv, image size (sequence length: its square), route), as CONVS
CONV1DS = {
    "ghost": (lambda: nn.Conv1d(16, 64, 3, stride=2, padding=1), 4, "ghost"),
    "kept": (lambda: nn.Conv1d(1, 2, 5, padding=2), 6, "kept"),
    "kept_strided_dilated": (lambda: nn.Conv1d(3, 4, 3, stride=2, padding=2, dilation=2), 5, "kept"),
    "dropped": (lambda: nn.Conv1d(16, 16, 3, padding=1), 4, "dropped"),
    "depthwise_multiplier": (lambda: nn.Conv1d(4, 8, 3, padding=1, groups=4), 3, "kept"),
    "eca": (lambda: nn.Conv1d(1, 1, 3, padding=1, bias=False), 4, "kept"),  # timm's EcaModule
}


@pytest.mark.parametrize("name", list(CONV1DS))
@pytest.mark.parametrize(("views", "calls"), [(1, 1), (2, 1), (1, 2)])
@pytest.mark.parametrize("kernels", ["cpu", "one_example_chunks", "product_sums", "convolution_sums"])
def test_each_conv1d_route_equals_the_vmap_engine(name, views, calls, kernels, monkeypatch):
    """A ``nn.Conv1d`` runs the convolution rule on height-1 maps; its gradients come back in its own weight shape."""
    build, size, route = CONV1DS[name]
    conv = _convolution_case(build, calls, kernels, monkeypatch)
    module = Wrapper(Sequences(conv, size, calls), views)
    generator = torch.Generator().manual_seed(2)
    inputs = (torch.randn(5, conv.in_channels, size, size, generator=generator), torch.randint(0, 3, (5,)))
    if calls == 1 and views == 1:
        probe = GhostClipper(module, "per_example_loss", 1.0)
        probe._output_gradients(inputs)
        rule = next(rule for rule in probe.rules if isinstance(rule, Conv1dRule))
        assert _route(rule, 5) == route
    _assert_ghost_equals_vmap(module, inputs)


class UnbatchedLayers(nn.Module):
    """A ``nn.Conv1d`` on each example's unbatched ``[C, L]`` sequence and a ``nn.Linear`` on each one's 1-D
    features, then a batched head."""

    def __init__(self):
        super().__init__()
        self.conv, self.linear, self.head = nn.Conv1d(2, 3, 3), nn.Linear(21, 5), nn.Linear(5, 3)

    def forward(self, x):
        return self.head(torch.stack([torch.tanh(self.linear(self.conv(seq).flatten())) for seq in x.flatten(2)]))


def test_unbatched_conv1d_and_linear_calls_go_to_vmap_with_the_reason_logged(caplog):
    torch.manual_seed(0)
    module = Wrapper(UnbatchedLayers(), 1)
    with caplog.at_level(logging.WARNING):
        ghost = _assert_ghost_equals_vmap(module, (torch.randn(4, 2, 3, 3), torch.randint(0, 3, (4,))))
    assert ghost.fallback_names == ["net.conv.weight", "net.conv.bias", "net.linear.weight", "net.linear.bias"]
    assert "(a Conv1d saw a 2-D input" in caplog.text and "(a Linear saw a 1-D input" in caplog.text


class _ScaledInTraining(nn.Linear):
    """A ``nn.Linear`` whose forward differs from ``nn.Linear``'s in training mode only (as weight dropout's would):
    the first step's check against the vmap engine runs in eval mode and cannot see it."""

    def forward(self, x):
        return F.linear(x, 2 * self.weight if self.training else self.weight, self.bias)


def _subclasses() -> dict[str, nn.Module]:
    from timm.layers import Conv2dSame, StdConv2d

    return {
        "std_conv": Convs(StdConv2d(3, 4, 3, padding=1), 5),  # standardizes its weight
        "same_conv": Convs(Conv2dSame(3, 4, 3, stride=2), 5),  # pads its input itself
        "scaled_linear": Tokens(_ScaledInTraining(3, 4), 3),
    }


@pytest.mark.parametrize("name", ["std_conv", "same_conv", "scaled_linear"])
def test_layer_subclasses_with_their_own_forward_get_the_generic_rule_and_stay_exact(name):
    """A closed-form rule computes the gradients of its base class's forward; a subclass that overrides it gets the
    generic rule (a vmap of the module itself), in training mode too."""
    torch.manual_seed(0)
    net = _subclasses()[name]
    layer = net.conv if hasattr(net, "conv") else net.linear
    rules, _ = plan_rules(net)
    assert type(next(rule for rule in rules if rule.module is layer)) is MaterializedRule
    module = Wrapper(net, 1).train()
    shape = (5, 3, 5, 5) if hasattr(net, "conv") else (5, 1, 3, 3)
    _assert_ghost_equals_vmap(module, (torch.randn(shape), torch.randint(0, 3, (5,))))


USER_HOOKS = {  # each replaces its tensor in training mode only: the first step's check runs in eval mode
    "output": lambda layer: layer.register_forward_hook(lambda mod, args, out: out * 2 if mod.training else None),
    "input": lambda layer: layer.register_forward_pre_hook(lambda mod, args: (args[0] * 3,) if mod.training else None),
}


def _hooked_net(name: str) -> tuple[nn.Module, list[nn.Module], tuple[int, ...]]:
    """A net, the modules a rule captures at, and the input shape."""
    if name == "linear":
        net = Tokens(nn.Linear(3, 4), 3)
        return net, [net.linear], (5, 1, 3, 3)
    if name == "conv":
        net = Convs(nn.Conv2d(2, 4, 3, padding=1), 4)
        return net, [net.conv], (5, 2, 4, 4)
    if name == "activated_norm":
        net = NormAct(_randomized(GroupNormAct(4, num_groups=2)))  # captured at its drop module's input
        return net, [net.norm, net.norm.drop], (5, 2, 5, 5)
    net = NormAct(nn.PReLU(4, init=0.3))  # the generic rule: a vmap of the layer on its captured input
    return net, [net.norm], (5, 2, 5, 5)


@pytest.mark.parametrize("hook", list(USER_HOOKS))
@pytest.mark.parametrize("net", ["linear", "conv", "activated_norm", "generic"])
def test_user_hooks_that_replace_a_layers_input_or_output_leave_its_rule_exact(hook, net):
    """The rules' capture hooks run before a user's (``Hook.first``): they see the layer's own output, whose gradient
    flows through what a user's hook makes of it, and the input the layer computes on. In training mode."""
    torch.manual_seed(0)
    model, layers, shape = _hooked_net(net)
    for layer in layers:
        USER_HOOKS[hook](layer)
    module = Wrapper(model, 1).train()
    generator = torch.Generator().manual_seed(8)
    _assert_ghost_equals_vmap(module, (torch.randn(shape, generator=generator), torch.randint(0, 3, (5,))))


GLOBAL_HOOKS = {  # for every module, each replacing the hooked layers' output or input
    "output": lambda hooked: torch.nn.modules.module.register_module_forward_hook(
        lambda mod, args, out: out * 2 if id(mod) in hooked else None
    ),
    "input": lambda hooked: torch.nn.modules.module.register_module_forward_pre_hook(
        lambda mod, args: (args[0] * 3,) if id(mod) in hooked else None
    ),
}


@pytest.mark.parametrize("hook", list(GLOBAL_HOOKS))
@pytest.mark.parametrize("net", ["linear", "conv", "activated_norm", "generic"])
def test_global_hooks_that_replace_layer_outputs_or_inputs_leave_the_sums_exact(hook, net, caplog, monkeypatch):
    """A forward hook or pre-hook registered for every module (``nn.modules.module.register_module_forward_hook``)
    runs before the rules' capture hooks, so what they would capture is its replacement (of a layer's output, or of
    the input at which an activated norm's output gradient is taken): while one is registered, the step's clipped
    sum comes from the vmap engine (a warning says so, once), and the ghost engine again once it is removed.
    Registered after a first step."""
    torch.manual_seed(0)
    model, layers, shape = _hooked_net(net)
    module = Wrapper(model, 1).train()
    generator = torch.Generator().manual_seed(8)
    inputs = (torch.randn(shape, generator=generator), torch.randint(0, 3, (5,), generator=generator))
    ghost = GhostClipper(module, "per_example_loss", 0.1)
    ghost(inputs)
    parts, clipped_part = [], ghost._clipped_part  # the parts the rules compute, from here on
    monkeypatch.setattr(ghost, "_clipped_part", lambda part: parts.append(part) or clipped_part(part))
    handle = GLOBAL_HOOKS[hook]({id(layer) for layer in layers})
    try:
        with caplog.at_level(logging.WARNING):
            actual, again = ghost(inputs), ghost(inputs)
        expected = PerExampleClipper(module, "per_example_loss", 0.1)(inputs)
    finally:
        handle.remove()
    for result in (actual, again):
        torch.testing.assert_close(result.norms, expected.norms)
        for name, grad in expected.grads.items():
            torch.testing.assert_close(result.grads[name], grad)
    assert caplog.text.count("global module forward hook") == 1 and not parts
    ghost(inputs)
    assert parts and not ghost._use_reference and not ghost.fallback_names  # computed by the rules


class _DropsFunctionally(nn.Module):
    """A layer with a parameter that draws dropout masks inside its own forward (no ``nn.Dropout`` module)."""

    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(4, 1, 1))

    def forward(self, x):
        return F.dropout(x * self.scale, 0.5, self.training)


def test_a_layer_drawing_randomness_in_its_forward_is_refused_with_a_clear_error():
    """The generic rule re-runs the layer and cannot replay its draws (the first step's check, in eval mode, draws
    none): the error names the layer and says what to do."""
    torch.manual_seed(0)
    net = NormAct(_DropsFunctionally())
    module = Wrapper(net, 1).train()
    assert type(next(rule for rule in plan_rules(module)[0] if rule.module is net.norm)) is MaterializedRule
    with pytest.raises(RuntimeError, match="_DropsFunctionally draws random numbers.*engine='vmap'"):
        GhostClipper(module, "per_example_loss", 1.0)((torch.randn(5, 2, 5, 5), torch.randint(0, 3, (5,))))


REPARAMETRIZATIONS = {
    "weight_norm_hook": lambda layer: nn.utils.weight_norm(layer),  # weight_g, weight_v; a pre-hook forms the weight
    "weight_norm": lambda layer: nn.utils.parametrizations.weight_norm(layer),
    "spectral_norm": lambda layer: nn.utils.parametrizations.spectral_norm(layer),
}


@pytest.mark.filterwarnings("ignore:.*weight_norm.*deprecated")
@pytest.mark.parametrize("name", list(REPARAMETRIZATIONS))
def test_reparametrized_weights_get_no_closed_form_rule_and_stay_exact(name):
    """A reparametrized weight is not the layer's own parameter: the parameters that form it get the generic rule or
    the vmap engine (a parametrization's module is called with no input), never the linear rule, and the clipped sum
    is the vmap engine's (eval mode: spectral norm's power iteration would update its vectors at each forward)."""
    torch.manual_seed(0)
    net = Tokens(REPARAMETRIZATIONS[name](nn.Linear(3, 4)), 3)
    rules, leftover = plan_rules(net)
    forming = {full for full, _ in net.named_parameters() if full.startswith("linear.") and full != "linear.bias"}
    assert not forming & {full for rule in rules if isinstance(rule, LinearRule) for full in rule.names.values()}
    assert set(leftover) == (set() if name == "weight_norm_hook" else forming)
    module = Wrapper(net, 1).eval()
    _assert_ghost_equals_vmap(module, (torch.randn(5, 1, 3, 3), torch.randint(0, 3, (5,))))


class Tokens(nn.Module):
    """A linear layer on ``tokens`` positions per row (as a transformer's token-wise layers), then a linear head."""

    def __init__(self, linear: nn.Linear, tokens: int):
        super().__init__()
        self.linear, self.tokens = linear, tokens
        self.head = nn.Linear(tokens * linear.out_features, 3)

    def forward(self, x):
        h = torch.tanh(self.linear(x.reshape(x.shape[0], self.tokens, -1)))
        return self.head(h.flatten(1))


# (in, out, positions, route): ghost norm when T (d + p) < d p, else materialized; one position: ||a||^2 ||g||^2.
LINEARS = {"one_position": (6, 4, 1), "ghost": (16, 16, 2), "materialized": (2, 3, 5)}


@pytest.mark.parametrize("name", list(LINEARS))
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("views", [1, 2])
def test_each_linear_route_equals_the_vmap_engine(name, bias, views):
    """Weight and bias norms of a linear layer on every route (the bias folded into the ghost norm's Gram matrix)."""
    d, p, positions = LINEARS[name]
    torch.manual_seed(0)
    module = Wrapper(Tokens(nn.Linear(d, p, bias=bias), positions), views)
    generator = torch.Generator().manual_seed(3)
    inputs = (torch.randn(5, 1, positions, d, generator=generator), torch.randint(0, 3, (5,), generator=generator))
    _assert_ghost_equals_vmap(module, inputs)


@pytest.mark.parametrize("name", list(CONVS))
@pytest.mark.parametrize("layout", ["contiguous", "channels_last", "sliced"])
@pytest.mark.parametrize("copies", ["one", "two"])
def test_unfolded_patches_are_f_unfold_exactly(name, layout, copies, monkeypatch):
    """``F.unfold``'s patches, transposed to rows ``[N, L, d]`` and each row ordered ``(kh, kw, C)``, whether copied
    once or, rows unfolded along the width first, twice (``CPU_TWO_COPY_RUN``; a dilated height always copies once)."""
    monkeypatch.setattr(ghost_conv, "CPU_TWO_COPY_RUN", 0 if copies == "one" else 10**6)
    build, size, _ = CONVS[name]
    conv = build()
    x = torch.randn(4, conv.in_channels, size + 3, size + 2)
    if layout == "channels_last":
        x = x.contiguous(memory_format=torch.channels_last)
    if layout == "sliced":  # a non-contiguous view with a storage offset
        x = x[1:, :, 2:, 1:]
    expected = F.unfold(x, conv.kernel_size, conv.dilation, conv.padding, conv.stride)  # [N, C kh kw, L]
    expected = expected.view(x.shape[0], conv.in_channels, *conv.kernel_size, -1).permute(0, 4, 2, 3, 1).flatten(2)
    assert torch.equal(ghost_conv.unfold_patches(x, conv), expected)


class UnbatchedCalls(nn.Module):
    """Calls its convolution once per example on an unbatched ``[C, H, W]`` image."""

    def __init__(self, conv: nn.Conv2d, size: int):
        super().__init__()
        self.conv = conv
        self.head = nn.Linear(conv(torch.zeros(conv.in_channels, size, size)).numel(), 2)

    def per_example_loss(self, x, y):
        features = torch.stack([self.conv(image) for image in x]).flatten(1)
        return F.cross_entropy(self.head(features), y, reduction="none")


@pytest.mark.parametrize("name", ["kept", "ghost"])
def test_unbatched_convolution_calls_go_to_vmap_and_sums_stay_exact(name, caplog):
    """Whichever route the layer would take, a call on a single image is not captured: the layer's parameters go to
    the vmap engine for good, the step is computed again without its hooks, and the log says why."""
    torch.manual_seed(0)
    build, size, _ = CONVS[name]
    module = UnbatchedCalls(build(), size)
    x, y = torch.randn(4, module.conv.in_channels, size, size), torch.randint(0, 2, (4,))
    with caplog.at_level(logging.WARNING):
        ghost = _assert_ghost_equals_vmap(module, (x, y))
    assert set(ghost.fallback_names) == {"conv.weight", "conv.bias"} and "3-D input" in caplog.text


class PairedOutput(nn.Module):
    """A leaf layer with its own parameter that returns a tuple (as ``nn.LSTM`` returns its output and states)."""

    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(torch.linspace(0.5, 1.5, 4))

    def forward(self, x):
        return x * self.scale, x.sum(-1)


class WithPairedOutput(nn.Module):
    def __init__(self):
        super().__init__()
        self.patch, self.pair, self.head = nn.Linear(3, 4), PairedOutput(), nn.Linear(4, 3)

    def forward(self, x):
        out, total = self.pair(torch.tanh(self.patch(x)))
        return self.head(out.mean(1)) + total.mean(1, keepdim=True)


@pytest.mark.parametrize("on_mismatch", ["raise", "fallback"])
def test_a_layer_returning_a_tuple_goes_to_vmap_and_the_step_stays_exact(on_mismatch):
    """Under either setting (``engine='ghost'`` raises on a mismatch, ``auto`` falls back) such a layer's parameters
    go to the vmap engine; under ``auto`` every parameter's from the next step on, as for any fallback."""
    torch.manual_seed(0)
    module = Wrapper(WithPairedOutput(), 1)
    inputs = (torch.randn(5, 2, 3), torch.randint(0, 3, (5,)))
    ghost = GhostClipper(module, "per_example_loss", 0.1, on_mismatch=on_mismatch)
    for _ in range(2):
        actual, expected = ghost(inputs), PerExampleClipper(module, "per_example_loss", 0.1)(inputs)
        torch.testing.assert_close(actual.norms, expected.norms)
        for name, grad in expected.grads.items():
            torch.testing.assert_close(actual.grads[name], grad)
    assert ghost.fallback_names == ["net.pair.scale"] and ghost._use_reference == (on_mismatch == "fallback")


def test_a_frozen_convolution_weight_leaves_a_bias_rule_that_stays_exact():
    torch.manual_seed(0)
    conv = nn.Conv2d(4, 8, 3, padding=1)
    conv.weight.requires_grad_(False)
    module = Wrapper(Convs(conv, 6), 1)
    generator = torch.Generator().manual_seed(3)
    inputs = (torch.randn(4, 4, 6, 6, generator=generator), torch.randint(0, 3, (4,), generator=generator))
    reference = PerExampleClipper(module, "per_example_loss", 0.1)(inputs)
    ghost = GhostClipper(module, "per_example_loss", 0.1)
    actual = ghost(inputs)
    torch.testing.assert_close(actual.norms, reference.norms, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(actual.grads["net.conv.bias"], reference.grads["net.conv.bias"])


@pytest.mark.parametrize(
    ("model", "shape", "kwargs"),
    [
        ("cnn_tanh", (1, 14, 14), {}),
        ("cnn_tanh", (1, 28, 28), {}),  # MNIST: conv2 on channels-last captures
        ("timm/resnet18", (3, 8, 8), {}),
        ("timm/vit_tiny_patch16_224", (3, 16, 16), {"img_size": 16, "patch_size": 4, "depth": 2}),
        ("timm/mobilenetv3_small_050", (3, 16, 16), {}),  # depthwise, GroupNormAct with activations
        ("timm/convnext_atto", (3, 32, 32), {"ls_init_value": 0.5}),  # LayerNorm2d, layer scale
        ("timm/resnet18", (3, 8, 8), {"block_args": {"attn_layer": "eca"}}),  # ECA's Conv1d across the channels
        ("timm/vit_tiny_patch16_224", (3, 16, 16), {"img_size": 16, "patch_size": 4, "depth": 2, "init_values": 0.5}),
        ("timm/deit_tiny_distilled_patch16_224", (3, 16, 16), {"img_size": 16, "patch_size": 4, "depth": 2}),
        ("timm/crossvit_tiny_240", (3, 48, 48), CROSSVIT_KWARGS),  # two branches' tokens, one shared pos_drop
        ("timm/swin_tiny_patch4_window7_224", (3, 16, 16), SWIN_KWARGS),  # window attention re-run, drop path on
        ("timm/cait_xxs24_224", (3, 16, 16), CAIT_KWARGS),  # class token into the class-attention blocks
        # tokens, embeddings, scales and F.linear products captured on the graph
        *[(name, shape, kwargs) for name, (shape, kwargs) in GRAPH_CAPTURED.items()],
        ("timm/maxvit_nano_rw_256", *MODELS["timm/maxvit_nano_rw_256"]),  # attention re-run for its bias table
    ],
)
@pytest.mark.parametrize("chunks", ["cache_sized", "one_example"])
def test_replacing_one_example_leaves_every_other_examples_norm_unchanged(model, shape, kwargs, chunks, monkeypatch):
    """No cross-example term in any rule (closed-form norms, kept / dropped / ghost / grouped convolutions, linear,
    tokens, layer scale, captures on the graph), with per-example convolution gradients formed in cache-sized chunks
    or one example at a time: the other examples' norms do not move when one example is replaced, and the replaced
    one's does."""
    from lightning_dprobust.methods import DPSGD

    if chunks == "one_example":
        monkeypatch.setattr(ghost_conv, "CPU_CHUNK_VALUES", 1)

    torch.manual_seed(0)
    module = DPSGD(model=model, num_classes=10, input_shape=shape, model_kwargs=kwargs).eval()
    generator = torch.Generator().manual_seed(4)
    x, y = torch.rand(5, *shape, generator=generator), torch.randint(0, 10, (5,), generator=generator)
    ghost = GhostClipper(module, "per_example_loss", 1.0)
    without_vmap_checks(ghost)
    before = ghost((x, y)).norms
    x[0] = torch.rand(shape, generator=generator)
    after = ghost((x, y)).norms
    torch.testing.assert_close(after[1:], before[1:], rtol=1e-10, atol=1e-12)
    assert not torch.isclose(after[0], before[0], rtol=1e-6)


class Tokens2Logits(nn.Module):
    """Token ids ``[B, T]`` through an embedding (``calls`` times: the ids, then the ids reversed), tanh, mean over the
    positions, a linear head; ``views`` rows per example (the ids rolled by 0, 1, ... positions)."""

    def __init__(self, embedding: nn.Embedding, views: int = 1, calls: int = 1):
        super().__init__()
        self.embedding, self.views, self.calls = embedding, views, calls
        self.head = nn.Linear(embedding.embedding_dim, 3)

    def per_example_loss(self, ids, y):
        rows = torch.stack([ids.roll(view, dims=1) for view in range(self.views)], dim=1).flatten(0, 1)
        h = sum(self.embedding(rows.flip(1) if call else rows) for call in range(self.calls))
        logits = self.head(torch.tanh(h).mean(1)).view(ids.shape[0], self.views, -1).mean(1)
        return F.cross_entropy(logits, y, reduction="none")


def _token_batch(examples: int = 5, positions: int = 6, vocabulary: int = 7) -> tuple[torch.Tensor, torch.Tensor]:
    """Ids from a small vocabulary, so that tokens repeat inside examples and across them; example 1 equals
    example 0, so that a row shared between examples would show."""
    generator = torch.Generator().manual_seed(5)
    ids = torch.randint(0, vocabulary, (examples, positions), generator=generator)
    ids[1] = ids[0]
    return ids, torch.randint(0, 3, (examples,), generator=generator)


@pytest.mark.parametrize("padding_idx", [None, 0, -1])
@pytest.mark.parametrize(("views", "calls"), [(1, 1), (2, 1), (1, 2)])
@pytest.mark.parametrize("ids_dtype", [torch.int64, torch.int32])
def test_the_embedding_rule_equals_the_vmap_engine(padding_idx, views, calls, ids_dtype):
    """Norms and clipped sums of an embedding table, with tokens repeated inside and across examples, padding
    positions (which get no gradient), augmentation views and two calls of the layer."""
    torch.manual_seed(0)
    module = Tokens2Logits(nn.Embedding(7, 5, padding_idx=padding_idx), views, calls)
    rules, _ = plan_rules(module)
    assert [type(rule) for rule in rules] == [EmbeddingRule, LinearRule]
    ids, y = _token_batch()
    _assert_ghost_equals_vmap(module, (ids.to(ids_dtype), y))


def test_the_embedding_rule_holds_one_row_per_example_and_token_and_no_table_per_example():
    """A vocabulary of a million rows: the rule holds one summed row for each distinct (example, token) pair, the
    two equal examples' rows apart, instead of each example's ``[vocabulary, dim]`` gradient. A forward after a step
    that failed between norms and sum leaves it nothing of that step."""
    torch.manual_seed(0)
    module = Tokens2Logits(nn.Embedding(10**6, 3))
    ids, y = _token_batch()
    ids = ids * 99_991  # spread over the table
    clipper = GhostClipper(module, "per_example_loss", 1.0)
    clipper._output_gradients((ids, y))
    rule = next(rule for rule in clipper.rules if isinstance(rule, EmbeddingRule))
    rule.sq_norms(ids.shape[0])
    rows, tokens, owners = rule._cache
    assert rows.shape == (sum(len(example.unique()) for example in ids), 3)
    for example in range(ids.shape[0]):
        assert torch.equal(tokens[owners == example], ids[example].unique())
    clipper._output_gradients((ids, y))
    assert rule._cache is None


@pytest.mark.parametrize(
    "embedding",
    [nn.Embedding(7, 5, max_norm=1.0), nn.Embedding(7, 5, scale_grad_by_freq=True)],
    ids=["max_norm", "scale_grad_by_freq"],
)
def test_embeddings_outside_the_rule_keep_the_generic_rule(embedding):
    """``max_norm`` renormalizes the table in place during the forward and ``scale_grad_by_freq`` divides by token
    counts: neither is the one-hot linear map the rule computes."""
    rules, leftover = plan_rules(embedding)
    assert [type(rule) for rule in rules] == [MaterializedRule] and not leftover


def test_resmlp_blocks_layer_scales():
    """timm's ResMLP (Touvron et al. 2021, arXiv 2105.03404): each ``ResBlock`` owns ``ls1`` (on its token-mixing
    layer's output, transposed) and ``ls2`` (on its channel MLP's): the block scale rule, no re-run; ``Affine``
    normalization gets the generic rule."""
    from timm.models.mlp_mixer import Affine, MlpMixer, ResBlock

    torch.manual_seed(0)
    mixer = MlpMixer(
        10, img_size=8, patch_size=2, num_blocks=4, embed_dim=8, block_layer=ResBlock, norm_layer=Affine, mlp_ratio=4
    )
    net = Wrapped(mixer)
    rules, leftover = plan_rules(net)
    assert not leftover
    assert {type(rule) for rule in rules if rule.module in set(mixer.blocks)} == {LayerScaleRule}
    generator = torch.Generator().manual_seed(8)
    _assert_ghost_equals_vmap(net, (torch.rand(5, 3, 8, 8, generator=generator), torch.randint(0, 10, (5,))))


class Wrapped(nn.Module):
    def __init__(self, net: nn.Module):
        super().__init__()
        self.net = net

    def per_example_loss(self, x, y):
        return F.cross_entropy(self.net(x), y, reduction="none")
