"""Parameters used outside any layer and captured on the autograd graph (``core/ghost/functional.py``): tokens expanded
over the rows, position embeddings added, scales multiplied. The ghost engine equals the vmap engine on them, and
every use the rule does not capture goes to the vmap engine."""

from __future__ import annotations

import logging

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from lightning_dprobust.core.ghost import GhostClipper
from lightning_dprobust.core.ghost.functional import BroadcastRule
from lightning_dprobust.core.ghost.layers import CompositeRule
from lightning_dprobust.core.ghost.plan import plan_rules
from lightning_dprobust.core.per_sample import PerExampleClipper
from lightning_dprobust.methods import DPSGD
from tests.core.ghost_checks import without_vmap_checks
from tests.core.test_ghost_rules import Wrapper as Rows
from tests.core.test_ghost_rules import _assert_ghost_equals_vmap

pytestmark = pytest.mark.usefixtures("double_precision")

TOKENS, DIM = 4, 6


class OwnViT(nn.Module):
    """A hand-written vision transformer on ``[N, TOKENS, 3]`` patch rows: a class token expanded and concatenated,
    a position embedding added, a branch scaled per channel, a scalar temperature on the class token's features.
    ``use`` swaps one of those for a use the rule does not capture."""

    def __init__(self, use: str = "captured"):
        super().__init__()
        self.patch, self.norm, self.fc = nn.Linear(3, DIM), nn.LayerNorm(DIM), nn.Linear(DIM, DIM)
        self.cls_token = nn.Parameter(torch.randn(1, 1, DIM))
        positions = TOKENS + 2 if use == "sliced" else TOKENS + 1  # a spare position, sliced away
        self.pos_embed = nn.Parameter(torch.randn(1, positions, DIM))
        self.gamma = nn.Parameter(torch.linspace(0.5, 1.5, DIM))
        self.temperature = nn.Parameter(torch.tensor(1.3))
        self.head = nn.Linear(DIM, 3)
        self.use = use

    def forward(self, x):
        h = self.patch(x)
        h = torch.cat([self.cls_token.expand(h.shape[0], -1, -1), h], dim=1)
        if self.use == "sliced":
            h = h + self.pos_embed[:, 1:]
        elif self.use == "alpha":
            h = torch.add(h, self.pos_embed, alpha=2)
        else:
            h = h + self.pos_embed
        gamma = self.gamma * self.gamma if self.use == "squared" else self.gamma
        h = h + gamma * torch.tanh(self.fc(self.norm(h)))
        logits = self.head(h[:, 0] * self.temperature)
        return logits + 0.01 * self.pos_embed.square().sum() if self.use == "penalized" else logits


def patches(examples: int = 5) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(3)
    return torch.randn(examples, TOKENS, 3, generator=generator), torch.randint(0, 3, (examples,), generator=generator)


@pytest.mark.parametrize("views", [1, 3])
@pytest.mark.parametrize("examples", [1, 5])
def test_tokens_embeddings_and_scales_equal_the_vmap_engine(views, examples):
    """Expand then concatenate, add, products with a per-channel and a scalar parameter: one and three rows per
    example, one and five examples; none goes to the vmap engine."""
    torch.manual_seed(0)
    module = Rows(OwnViT(), views)
    rules, leftover = plan_rules(module)
    broadcast = {local for rule in rules if isinstance(rule, BroadcastRule) for local in rule.names}
    assert not leftover and broadcast == {"cls_token", "pos_embed", "gamma", "temperature"}
    ghost = _assert_ghost_equals_vmap(module, patches(examples))
    assert not ghost.fallback_names


@pytest.mark.parametrize(
    ("use", "moved"),
    [
        ("sliced", "net.pos_embed"),  # a slice of the embedding: a SliceBackward between it and the add
        ("penalized", "net.pos_embed"),  # a penalty on it in the loss
        ("alpha", "net.pos_embed"),  # added twice over (torch.add(x, p, alpha=2)): not the gradient at the output
        ("squared", "net.gamma"),  # the parameter twice in one product
    ],
)
def test_a_use_the_rule_does_not_capture_goes_to_vmap_and_sums_stay_exact(use, moved, caplog):
    torch.manual_seed(0)
    module = Rows(OwnViT(use))
    with caplog.at_level(logging.WARNING):
        ghost = _assert_ghost_equals_vmap(module, patches())
    assert ghost.fallback_names == [moved]
    assert "outside their layers' calls" in caplog.text


class TokenBias(nn.Module):
    """A parameter expanded over the tokens (not the rows) and added to every row: the expand's output rows are
    tokens, each summing the gradient of every example."""

    def __init__(self, tokens: int):
        super().__init__()
        self.patch, self.head = nn.Linear(3, DIM), nn.Linear(DIM, 3)
        self.bias = nn.Parameter(torch.randn(1, DIM))
        self.tokens = tokens

    def forward(self, x):
        return self.head(torch.tanh(self.patch(x) + self.bias.expand(self.tokens, DIM)).mean(1))


@pytest.mark.parametrize("on_mismatch", ["raise", "fallback"])
def test_a_parameter_broadcast_over_tokens_fails_the_first_step_check_and_goes_to_vmap(on_mismatch):
    """Six token rows look like two rows per example for the check's three examples: the rule captures them, and the
    first-step comparison with the vmap engine sends the parameter to vmap (the whole model under ``auto``), exact,
    without failing the step."""
    torch.manual_seed(0)
    module = DPSGD(model=TokenBias(6), num_classes=3, input_shape=(6, 3))
    x, y = torch.randn(5, 6, 3), torch.randint(0, 3, (5,))
    ghost = GhostClipper(module, "per_example_loss", 1.0, on_mismatch=on_mismatch)
    actual = ghost((x, y))
    assert ghost.fallback_names == ["model.bias"]
    assert ghost._use_reference == (on_mismatch == "fallback")
    expected = PerExampleClipper(module, "per_example_loss", 1.0)((x, y))
    torch.testing.assert_close(actual.norms, expected.norms)
    for name, grad in expected.grads.items():
        torch.testing.assert_close(actual.grads[name], grad)


def test_a_first_batch_of_one_example_is_not_the_first_step_check():
    """One example cannot show rows laid out otherwise than by example: such a batch goes to the vmap engine, and the
    check waits for a batch of two examples or more."""
    torch.manual_seed(0)
    module = DPSGD(model=TokenBias(6), num_classes=3, input_shape=(6, 3))
    ghost = GhostClipper(module, "per_example_loss", 1.0)
    x, y = torch.randn(5, 6, 3), torch.randint(0, 3, (5,))
    ghost((x[:1], y[:1]))
    assert not ghost._verified and not ghost.fallback_names
    ghost((x, y))
    assert ghost._verified and ghost.fallback_names == ["model.bias"]


def test_a_parameter_broadcast_over_rows_that_are_not_a_multiple_of_the_examples_goes_to_vmap():
    """Five token rows for five examples would pass as one row each (and two examples would not divide them): with
    four examples they are not captured, so the graph check moves the parameter to the vmap engine."""
    torch.manual_seed(0)
    module = DPSGD(model=TokenBias(5), num_classes=3, input_shape=(5, 3))
    ghost = GhostClipper(module, "per_example_loss", 1.0)
    without_vmap_checks(ghost)
    generator = torch.Generator().manual_seed(4)
    ghost((torch.randn(4, 5, 3, generator=generator), torch.randint(0, 3, (4,), generator=generator)))
    assert ghost.fallback_names == ["model.bias"]


class SharedGrid(nn.Module):
    """A linear layer applied once to a position grid the batch shares (as XCiT's Fourier position encoding), its
    output added to every row: the layer's call has one row for the whole batch."""

    def __init__(self):
        super().__init__()
        self.patch, self.grid_proj, self.head = nn.Linear(3, DIM), nn.Linear(2, DIM), nn.Linear(DIM, 3)
        self.register_buffer("grid", torch.linspace(-1, 1, TOKENS * 2).view(1, TOKENS, 2))

    def forward(self, x):
        return self.head(torch.tanh(self.patch(x) + self.grid_proj(self.grid)).mean(1))


def test_a_layer_called_once_for_the_batch_goes_to_vmap_and_sums_stay_exact(caplog):
    torch.manual_seed(0)
    module = DPSGD(model=SharedGrid(), num_classes=3, input_shape=(TOKENS, 3))
    with caplog.at_level(logging.WARNING):
        ghost = _assert_ghost_equals_vmap(module, patches())
    assert ghost.fallback_names == ["model.grid_proj.weight", "model.grid_proj.bias"]
    assert "not a multiple of the examples" in caplog.text


def test_a_parametrizations_originals_are_not_captured_on_the_graph():
    """``nn.utils.parametrize`` originals are used through the parametrization only: left to the vmap engine."""
    layer = nn.utils.parametrizations.weight_norm(nn.Linear(3, DIM))
    _, leftover = plan_rules(nn.Sequential(layer, nn.Linear(DIM, 3)))
    assert set(leftover) == {"0.parametrizations.weight.original0", "0.parametrizations.weight.original1"}


class FusedQKV(nn.Module):
    """BEiT's and EVA's attention input projection: ``F.linear`` of the layer's weight with a bias the module
    assembles from its own ``q_bias`` and ``v_bias`` (the key bias fixed at zero), an ``addmm`` of the input rows and
    ``weight.t()``. Other uses (``product``): ``"mm"``, ``F.linear`` without bias on a non-contiguous input (an
    ``mm``), then the bias added; ``"token_major"``, the same on the input's tokens-first transpose, whose rows are
    not grouped by example; ``"scaled"``, the product with twice the weight, which no capture takes;
    ``"bias_reused"``, ``q_bias`` also used elsewhere, so not captured as a piece of the bias."""

    def __init__(self, product: str = "addmm"):
        super().__init__()
        self.qkv = nn.Linear(DIM, 3 * DIM, bias=False)
        self.q_bias, self.v_bias = nn.Parameter(torch.randn(DIM)), nn.Parameter(torch.randn(DIM))
        self.register_buffer("k_bias", torch.zeros(DIM))
        self.product = product

    def forward(self, h):
        bias = torch.cat((self.q_bias, self.k_bias, self.v_bias))
        if self.product == "addmm":
            return F.linear(h, self.qkv.weight, bias)
        if self.product == "mm":
            return F.linear(torch.cat([h, h], dim=-1)[..., :DIM], self.qkv.weight) + bias
        if self.product == "token_major":
            return F.linear(h.transpose(0, 1), self.qkv.weight).transpose(0, 1) + bias
        if self.product == "bias_reused":  # q_bias also scales the input, between the concatenation and the product
            return F.linear(h * self.q_bias.sum(), self.qkv.weight, bias)
        return F.linear(h, 2 * self.qkv.weight, bias)


class Attentive(nn.Module):
    def __init__(self, product: str):
        super().__init__()
        self.patch, self.attn, self.head = nn.Linear(3, DIM), FusedQKV(product), nn.Linear(3 * DIM, 3)

    def forward(self, x):
        return self.head(torch.tanh(self.attn(self.patch(x))).mean(1))


@pytest.mark.parametrize("views", [1, 2])
@pytest.mark.parametrize("product", ["addmm", "mm"])
@pytest.mark.parametrize("owner", ["large", "composite"])
def test_a_linear_weight_used_by_f_linear_outside_its_layer_equals_the_vmap_engine(product, views, owner, monkeypatch):
    """The product is captured as a call of the layer's rule from the first step on; the module's own biases, pieces
    of the product's bias, are captured on the graph too: planned so when their owner is too large to re-run, or
    in place of the owner's composite rule, which then gives way."""
    if owner == "composite":
        monkeypatch.setattr(CompositeRule, "MAX_SHARE", 1.0)
    torch.manual_seed(0)
    module = Rows(Attentive(product), views)
    ghost = _assert_ghost_equals_vmap(module, patches())
    assert not ghost.fallback_names
    assert [rule.names for rule in ghost._functional] == [{"weight": "net.attn.qkv.weight"}]
    biases = {name for rule in ghost.rules if isinstance(rule, BroadcastRule) for name in rule.names}
    assert biases == {"q_bias", "v_bias"} and not any(isinstance(rule, CompositeRule) for rule in ghost.rules)


@pytest.mark.parametrize(("product", "moved"), [("scaled", "net.attn.qkv.weight"), ("bias_reused", "net.attn.q_bias")])
def test_a_use_that_no_capture_takes_goes_to_vmap_and_sums_stay_exact(product, moved):
    torch.manual_seed(0)
    ghost = _assert_ghost_equals_vmap(Rows(Attentive(product)), patches())
    assert ghost.fallback_names == [moved]


@pytest.mark.parametrize("on_mismatch", ["raise", "fallback"])
def test_a_token_major_product_fails_the_first_step_check_and_goes_to_vmap(on_mismatch, monkeypatch, caplog):
    """Tokens-first rows (``nn.MultiheadAttention``'s layout without ``batch_first``) look like examples' rows to
    the capture; the first-step check sees the layer's norms differ and sends its weight to the vmap engine, without
    failing the step, whichever ``on_mismatch``."""
    monkeypatch.setattr(CompositeRule, "MAX_SHARE", 1.0)
    torch.manual_seed(0)
    module = Rows(Attentive("token_major"))
    inputs = patches(6)
    ghost = GhostClipper(module, "per_example_loss", 1.0, on_mismatch=on_mismatch)
    with caplog.at_level(logging.WARNING):
        actual = ghost(inputs)
    assert ghost.fallback_names == ["net.attn.qkv.weight"] and "differed from the vmap engine's" in caplog.text
    expected = PerExampleClipper(module, "per_example_loss", 1.0)(inputs)
    torch.testing.assert_close(actual.norms, expected.norms)
    for name, grad in expected.grads.items():
        torch.testing.assert_close(actual.grads[name], grad)


def test_xcit_captures_its_tokens_scales_and_shared_fourier_projection():
    """XCiT's class token and blocks' scales are captured on the graph; its position encoding projects a grid the
    batch shares (one row) and repeats it per example, so that layer's call is spread over the repeat: nothing goes
    to the vmap engine."""
    torch.manual_seed(0)
    kwargs = {"img_size": 16, "patch_size": 8, "embed_dim": 16, "depth": 2, "num_heads": 2, "cls_attn_layers": 1}
    module = DPSGD(model="timm/xcit_nano_12_p16_224", num_classes=3, input_shape=(3, 16, 16), model_kwargs=kwargs)
    generator = torch.Generator().manual_seed(2)
    inputs = (torch.rand(5, 3, 16, 16, generator=generator), torch.randint(0, 3, (5,), generator=generator))
    ghost = _assert_ghost_equals_vmap(module, inputs)
    assert not ghost.fallback_names
    assert [set(rule.names.values()) for rule in ghost._spread.values()] == [
        {"model.net.pos_embed.token_projection.weight", "model.net.pos_embed.token_projection.bias"}
    ]
    assert any(isinstance(rule, BroadcastRule) and "cls_token" in rule.names for rule in ghost.rules)


class RepeatedGrid(nn.Module):
    """Patch rows plus a projection of a grid of ``grid_rows`` rows that every example shares, repeated per example
    as XCiT's position encoding and summed over the grid's rows. ``use`` swaps the repeat for a use no spread takes:
    the projection also used once more, repeated along another dim, or expanded."""

    def __init__(self, use: str = "repeat", grid_rows: int = 1):
        super().__init__()
        self.patch, self.project, self.head = nn.Linear(3, DIM), nn.Linear(4, DIM), nn.Linear(DIM, 3)
        self.register_buffer("grid", torch.linspace(-1, 1, grid_rows * TOKENS * 4).view(grid_rows, TOKENS, 4))
        self.use = use

    def forward(self, x):
        examples, rows = x.shape[0], self.grid.shape[0]
        projected = self.project(self.grid)  # [rows, TOKENS, DIM], the same for every example
        if self.use == "expand":
            shared = projected.expand(examples, -1, -1)
        elif self.use == "inner_repeat":
            shared = projected.repeat(1, examples, 1).view(rows, examples, TOKENS, DIM).transpose(0, 1).sum(1)
        else:
            shared = projected.repeat(examples, 1, 1).view(examples, rows, TOKENS, DIM).sum(1)
        h = torch.tanh(self.patch(x) + shared)
        logits = self.head(h.mean(1))
        return logits + projected.mean() if self.use == "reused" else logits


@pytest.mark.parametrize(
    ("use", "grid_rows"),
    [("repeat", 1), ("repeat", 2), ("reused", 1), ("reused", 2), ("inner_repeat", 2), ("expand", 1)],
)
def test_a_layer_on_a_shared_tensor_is_spread_over_its_repeat_or_goes_to_vmap(use, grid_rows):
    torch.manual_seed(0)
    ghost = _assert_ghost_equals_vmap(Rows(RepeatedGrid(use, grid_rows)), patches())
    if use == "repeat":
        assert not ghost.fallback_names and list(ghost._spread.values())[0].names == {
            "weight": "net.project.weight",
            "bias": "net.project.bias",
        }
    else:
        assert ghost.fallback_names == ["net.project.weight", "net.project.bias"] and not ghost._spread


def test_a_spread_layer_stays_spread_when_its_rows_divide_a_later_batch():
    """A grid of two rows, spread in a batch of three examples, is still spread in batches of two and of one, where
    its two rows would otherwise pass for the examples'."""
    torch.manual_seed(0)
    module = Rows(RepeatedGrid("repeat", grid_rows=2))
    ghost = GhostClipper(module, "per_example_loss", 0.05)
    reference = PerExampleClipper(module, "per_example_loss", 0.05)
    for examples in (3, 2, 1):
        inputs = patches(examples)
        actual, expected = ghost(inputs), reference(inputs)
        torch.testing.assert_close(actual.norms, expected.norms)
        for name, grad in expected.grads.items():
            torch.testing.assert_close(actual.grads[name], grad)
    assert not ghost.fallback_names and ghost._shared_rows == {id(ghost._spread[next(iter(ghost._spread))]): {2}}


class SquaredToken(nn.Module):
    """A token squared in one product (``token * token``), added to every row: for a batch of one example the
    product's single row looks like the example's, yet its output gradient times the other factor is half the
    token's gradient."""

    def __init__(self):
        super().__init__()
        self.patch, self.head = nn.Linear(3, DIM), nn.Linear(DIM, 3)
        self.token = nn.Parameter(torch.randn(1, 1, DIM))

    def forward(self, x):
        return self.head(torch.tanh(self.patch(x) + self.token * self.token).mean(1))


def test_a_parameter_twice_in_one_node_is_not_captured_even_for_one_example():
    torch.manual_seed(0)
    module = DPSGD(model=SquaredToken(), num_classes=3, input_shape=(TOKENS, 3))
    ghost = GhostClipper(module, "per_example_loss", 0.1)
    without_vmap_checks(ghost)  # as after a first step of several examples
    x, y = patches(1)
    expected = PerExampleClipper(module, "per_example_loss", 0.1)((x, y))
    actual = ghost((x, y))
    assert ghost.fallback_names == ["model.token"]
    for name, grad in expected.grads.items():
        torch.testing.assert_close(actual.grads[name], grad)
