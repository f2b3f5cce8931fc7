"""Per-example clipping engine: clip bound, no cross-example terms, equivalence, augmentation groups."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from lightning_dprobust.core import per_sample
from lightning_dprobust.core.engines import build_clipper
from lightning_dprobust.core.per_sample import (
    CLIPPING_RULES,
    PerExampleClipper,
    add_noise_and_scale_,
    clip_factors,
    gaussian_noise_like,
    per_example_norms,
)


class TinyNet(nn.Module):
    """Conv + tanh + linear; ``per_example_loss`` averages over an optional views dimension."""

    def __init__(self, channels: int = 3, hidden: int = 5, classes: int = 4) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, channels, 3, padding=1)
        self.norm = nn.GroupNorm(1, channels)
        self.fc = nn.Linear(channels * 16, hidden)
        self.out = nn.Linear(hidden, classes)

    def forward(self, x):
        h = torch.tanh(self.norm(self.conv(x))).flatten(1)
        return self.out(torch.tanh(self.fc(h)))

    def per_example_loss(self, x, y):
        if x.dim() == 4:
            return F.cross_entropy(self(x), y, reduction="none")
        b, v = x.shape[:2]
        losses = F.cross_entropy(self(x.flatten(0, 1)), y.repeat_interleave(v), reduction="none")
        return losses.view(b, v).mean(1)


ENGINES = ("vmap", "ghost")


def clipper_for(engine: str, net: nn.Module, max_grad_norm: float, **kwargs):
    """The clipper of ``engine`` ("vmap" or "ghost"); every privacy property below must hold for both."""
    return build_clipper(engine, net, "per_example_loss", max_grad_norm, **kwargs)[0]


def batch(size: int, views: int = 0, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    shape = (size, views, 1, 4, 4) if views else (size, 1, 4, 4)
    return torch.rand(shape, generator=g) * 3, torch.randint(0, 4, (size,), generator=g)


def flat(grads: dict) -> torch.Tensor:
    return torch.cat([g.flatten() for g in grads.values()])


def contribution(clipper, x, y, i):
    """Example ``i``'s contribution to the clipped sum: sum over the batch minus sum without ``i``."""
    keep = [j for j in range(len(y)) if j != i]
    return flat(clipper((x, y)).grads) - flat(clipper((x[keep], y[keep])).grads)


@settings(max_examples=20, deadline=None)
@given(
    size=st.integers(2, 6),
    views=st.sampled_from([0, 1, 3]),
    max_grad_norm=st.floats(1e-3, 2.0),
    clipping=st.sampled_from(CLIPPING_RULES),
    seed=st.integers(0, 10_000),
    engine=st.sampled_from(ENGINES),
)
def test_each_example_contributes_at_most_max_grad_norm(size, views, max_grad_norm, clipping, seed, engine):
    torch.manual_seed(seed)
    clipper = clipper_for(engine, TinyNet(), max_grad_norm, clipping=clipping)
    x, y = batch(size, views, seed)
    for i in range(size):
        assert contribution(clipper, x, y, i).norm() <= max_grad_norm * (1 + 1e-4)


@pytest.mark.parametrize("engine", ENGINES)
def test_single_large_gradient_is_clipped_to_exactly_the_bound(engine):
    torch.manual_seed(0)
    clipper = clipper_for(engine, TinyNet(), 1e-3)
    out = clipper(batch(1))
    assert out.norms[0] > 1e-3
    assert flat(out.grads).norm() == pytest.approx(1e-3, rel=1e-3)


@pytest.mark.parametrize("views", [0, 2])
@pytest.mark.parametrize("engine", ENGINES)
def test_changing_one_example_leaves_every_other_contribution_unchanged(views, engine):
    torch.manual_seed(1)
    clipper = clipper_for(engine, TinyNet(), 0.05)
    x, y = batch(5, views, 3)
    x2, y2 = x.clone(), y.clone()
    x2[2] = torch.rand_like(x2[2]) * 3
    y2[2] = (y2[2] + 1) % 4
    for i in (0, 1, 3, 4):
        torch.testing.assert_close(contribution(clipper, x, y, i), contribution(clipper, x2, y2, i))


@pytest.mark.parametrize("engine", ENGINES)
def test_huge_clip_equals_ordinary_batch_gradient(engine):
    torch.manual_seed(2)
    net = TinyNet()
    x, y = batch(6, seed=4)
    out = clipper_for(engine, net, 1e9)((x, y))
    net.zero_grad()
    net.per_example_loss(x, y).sum().backward()
    for name, p in net.named_parameters():
        torch.testing.assert_close(out.grads[name], p.grad, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("engine", ENGINES)
def test_norms_match_one_example_at_a_time(engine):
    torch.manual_seed(3)
    net = TinyNet()
    x, y = batch(4, seed=5)
    out = clipper_for(engine, net, 1.0)((x, y))
    for i in range(4):
        net.zero_grad()
        net.per_example_loss(x[i : i + 1], y[i : i + 1]).sum().backward()
        expected = torch.cat([p.grad.flatten() for p in net.parameters()]).norm()
        assert out.norms[i] == pytest.approx(expected.item(), rel=1e-4)


@pytest.mark.parametrize("engine", ENGINES)
def test_augmentation_group_gradient_is_mean_of_view_gradients_before_clipping(engine):
    torch.manual_seed(4)
    net = TinyNet()
    x, y = batch(1, views=3, seed=6)
    out = clipper_for(engine, net, 1e9)((x, y))
    view_grads = []
    for v in range(3):
        net.zero_grad()
        net.per_example_loss(x[:, v], y).sum().backward()
        view_grads.append(torch.cat([p.grad.flatten() for p in net.parameters()]))
    torch.testing.assert_close(flat(out.grads), torch.stack(view_grads).mean(0), rtol=1e-4, atol=1e-6)


def test_chunked_equals_unchunked():
    torch.manual_seed(5)
    net = TinyNet()
    x, y = batch(7, seed=7)
    whole = PerExampleClipper(net, "per_example_loss", 0.1)((x, y))
    chunked = PerExampleClipper(net, "per_example_loss", 0.1, max_physical_batch_size=3)((x, y))
    torch.testing.assert_close(flat(whole.grads), flat(chunked.grads))
    torch.testing.assert_close(whole.norms, chunked.norms)


@pytest.mark.parametrize("engine", ENGINES)
def test_empty_batch_gives_zero_sum(engine):
    out = clipper_for(engine, TinyNet(), 1.0)(batch(0))
    assert out.norms.numel() == 0
    assert flat(out.grads).abs().sum() == 0


@pytest.mark.parametrize("engine", ENGINES)
def test_frozen_parameters_are_not_differentiated(engine):
    net = TinyNet()
    net.conv.weight.requires_grad_(False)
    out = clipper_for(engine, net, 1.0)(batch(3))
    assert "conv.weight" not in out.grads and "conv.bias" in out.grads


def test_per_example_norms_is_flat_l2():
    grads = {"a": torch.tensor([[3.0, 0.0], [0.0, 0.0]]), "b": torch.tensor([[4.0], [1.0]])}
    torch.testing.assert_close(per_example_norms(grads), torch.tensor([5.0, 1.0]))


def test_noise_has_requested_std():
    grads = {"w": torch.zeros(200_000)}
    noise = gaussian_noise_like(grads, 0.7, torch.Generator().manual_seed(0))["w"]
    assert noise.std().item() == pytest.approx(0.7, rel=0.01)
    assert gaussian_noise_like(grads, 0.0)["w"].abs().sum() == 0


@pytest.mark.parametrize("bound", [4, 1 << 22])
@pytest.mark.parametrize("std", [0.0, 0.7])
def test_in_place_noise_draws_the_same_noise_as_gaussian_noise_like(std, bound, monkeypatch):
    monkeypatch.setattr(per_sample, "NOISE_DRAW_VALUES", bound)  # 4: some draws hold several gradients, some one
    grads = {"a": torch.randn(3, 4), "b": torch.randn(2), "c": torch.randn(1), "d": torch.randn(5), "e": torch.randn(1)}
    noise = gaussian_noise_like(grads, std, torch.Generator().manual_seed(1))
    expected = {name: (g + noise[name]) * 0.25 for name, g in grads.items()}
    out = add_noise_and_scale_({k: g.clone() for k, g in grads.items()}, std, 0.25, torch.Generator().manual_seed(1))
    for name in grads:
        torch.testing.assert_close(out[name], expected[name], rtol=0, atol=0)


@pytest.mark.parametrize("bound", [3, 1 << 22])
def test_noise_of_many_small_gradients_is_independent_with_the_requested_std(bound, monkeypatch):
    """Grouped draws (one call for several gradients) give every value its own N(0, std^2) draw: no value is reused
    across gradients or groups, and gradients of other dtypes get their own draws."""
    monkeypatch.setattr(per_sample, "NOISE_DRAW_VALUES", bound)
    grads = {f"p{i}": torch.zeros(3, dtype=torch.float64) for i in range(20_000)} | {"f": torch.zeros(3)}
    out = add_noise_and_scale_(grads, 0.7, 1.0, torch.Generator().manual_seed(2))
    values = torch.cat([g.double() for g in out.values()])  # float64 draws: a repeated value means a reused draw
    assert values.std().item() == pytest.approx(0.7, rel=0.02)
    assert values.unique().numel() == values.numel()
    assert out["f"].dtype == torch.float32 and out["f"].abs().min() > 0


@pytest.mark.parametrize("bad", [0.0, -1.0, float("nan"), float("inf")])
def test_rejects_bad_clip(bad):
    with pytest.raises(ValueError, match="max_grad_norm"):
        PerExampleClipper(TinyNet(), "per_example_loss", bad)


def test_clipping_rules_match_their_formulas():
    norms = torch.tensor([0.001, 0.5, 3.0])
    torch.testing.assert_close(clip_factors(norms, 1.0, "flat"), torch.tensor([1.0, 1.0, 1 / (3.0 + 1e-6)]))
    torch.testing.assert_close(clip_factors(norms, 2.0, "psac"), 2.0 / (norms + 0.01 / (norms + 0.01)))
    torch.testing.assert_close(clip_factors(norms, 2.0, "automatic"), 2.0 / (norms + 0.01))
    with pytest.raises(ValueError, match="clipping"):
        clip_factors(norms, 1.0, "per-layer")


class SharedBlockNet(TinyNet):
    """A layer held under two paths (as CoaT's position encodings: by the model and by a block) and a weight tied
    into a second module: one slot under two names, and one parameter in two slots."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([nn.Sequential(self.conv)])
        self.tied = nn.Linear(self.out.in_features, self.out.out_features, bias=False)
        self.tied.weight = self.out.weight

    def forward(self, x):
        h = torch.tanh(self.norm(self.blocks[0](x))).flatten(1)
        h = torch.tanh(self.fc(h))
        return self.out(h) + self.tied(h)


@pytest.mark.parametrize("engine", ENGINES)
def test_a_module_under_two_names_keeps_its_parameters_and_gets_both_uses_gradients(engine):
    """``torch.func.functional_call`` restored such a slot twice, the substitute last: the module was left holding a
    functorch tensor, not its parameter, and the next steps trained without it. Each example's gradient must also
    include the tied weight's second use."""
    torch.manual_seed(4)
    net = SharedBlockNet()
    held = {name: p for name, p in net.named_parameters(remove_duplicate=False)}
    x, y = batch(3, seed=6)
    for _ in range(2):  # the second call runs on what the first left
        out = clipper_for(engine, net, 1e9)((x, y))
    assert {name: p for name, p in net.named_parameters(remove_duplicate=False)} == held
    assert not any(torch._C._functorch.is_functorch_wrapped_tensor(p) for p in held.values())
    for i in range(3):
        net.zero_grad()
        net.per_example_loss(x[i : i + 1], y[i : i + 1]).sum().backward()
        expected = torch.cat([p.grad.flatten() for p in net.parameters()]).norm()
        assert out.norms[i] == pytest.approx(expected.item(), rel=1e-4)


def test_stateless_call_refuses_a_missing_name_and_two_tensors_for_one_tied_parameter():
    net, x = SharedBlockNet(), torch.zeros(1, 1, 4, 4)
    with pytest.raises(KeyError, match="no parameter or buffer named 'nope'"):
        per_sample.stateless_call(net, {"nope": torch.zeros(1)}, (x,))
    weight = net.out.weight.detach()
    with pytest.raises(ValueError, match="same tied tensor"):
        per_sample.stateless_call(net, {"out.weight": weight, "tied.weight": weight.clone()}, (x,))
    same = per_sample.stateless_call(net, {"out.weight": weight, "tied.weight": weight}, (x,))
    torch.testing.assert_close(same, net(x))
