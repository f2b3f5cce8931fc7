"""The ghost engine computes in float32 whatever the caller's precision: under bf16 autocast or TF32 its norms and its
clipped sum, formed by different products, would be rounded differently and a share could exceed the clip.

Float32 tests (no ``double_precision``: autocast leaves float64 alone)."""

from __future__ import annotations

import pytest
import torch

from lightning_dprobust.core.ghost import EngineMismatch, GhostClipper
from lightning_dprobust.core.per_sample import PerExampleClipper
from lightning_dprobust.methods import DPSGD
from tests.core.ghost_checks import without_vmap_checks


def batch(shape: tuple[int, ...], size: int):
    generator = torch.Generator().manual_seed(0)
    return torch.rand(size, *shape, generator=generator), torch.randint(0, 10, (size,), generator=generator)


def build(model: str, shape: tuple[int, ...]) -> DPSGD:
    torch.manual_seed(0)
    return DPSGD(model=model, num_classes=10, input_shape=shape)


def flags() -> tuple[bool, bool, bool]:
    """``(cpu autocast on, cuDNN TF32 on, CUDA matmul TF32 on)``."""
    return torch.is_autocast_enabled("cpu"), torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32


@pytest.mark.usefixtures("tf32_on")
def test_autocast_is_off_in_every_call_tf32_in_the_products_and_the_flags_are_restored():
    """bf16 autocast and TF32 would round the norm's and the sum's factors differently. Autocast is off in every call;
    TF32 is off in the products that form the norms and the clipped sums (every rule's ``sq_norms`` and
    ``clipped_sum``) and throughout the first step's check (its passes over 3 examples and over the whole batch),
    while the training steps' forward and backward keep the caller's TF32 setting; all flags are restored after, also
    when the call raises."""
    module = build("cnn_tanh", (1, 8, 8))
    ghost = GhostClipper(module, "per_example_loss", 1.0)
    forwards, products = [], []
    original = module.per_example_loss

    def spy_loss(x, y):
        forwards.append((x.shape[0], flags()))
        if x.shape[0] == 4:
            raise ValueError("planted")
        return original(x, y)

    def spy(method):
        def wrapped(*args):
            products.append(flags())
            return method(*args)

        return wrapped

    module.per_example_loss = spy_loss
    for rule in ghost.rules:
        rule.sq_norms, rule.clipped_sum = spy(rule.sq_norms), spy(rule.clipped_sum)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ghost(batch((1, 8, 8), size=5))
        ghost(batch((1, 8, 8), size=6))
        # the first step's check: 3 examples, the whole batch of 5, then each checked example alone; then the step
        (first_check_pass_of_5,) = [i for i, (size, _) in enumerate(forwards) if size == 5][:1]
        checked = {f for i, (size, f) in enumerate(forwards) if size <= 3 or i == first_check_pass_of_5}
        trained = {f for i, (size, f) in enumerate(forwards) if size > 3 and i != first_check_pass_of_5}
        assert checked == {(False, False, False)} and trained == {(False, True, True)}
        assert products and set(products) == {(False, False, False)}
        assert flags() == (True, True, True)
        with pytest.raises(ValueError, match="planted"):
            ghost(batch((1, 8, 8), size=4))
        assert flags() == (True, True, True)
    assert (torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32) == (True, True)


@pytest.mark.usefixtures("tf32_on")
@pytest.mark.parametrize("as_ghost_fallback", [False, True])
def test_the_vmap_engines_weighted_sum_runs_without_tf32(monkeypatch, as_ghost_fallback):
    """The vmap engine's clipped sum (an einsum of the clip factors and the per-example gradients), alone or as the
    ghost engine's fallback, runs with TF32 off even when the caller turned it on, and the flags are restored."""
    module = build("cnn_tanh", (1, 8, 8))
    clipper = PerExampleClipper(module, "per_example_loss", 1.0)
    if as_ghost_fallback:
        clipper = GhostClipper(module, "per_example_loss", 1.0)
        clipper._verified = clipper._use_reference = True
    seen, einsum = [], torch.einsum

    def spy(*args):
        seen.append(flags()[1:])
        return einsum(*args)

    monkeypatch.setattr(torch, "einsum", spy)
    clipper(batch((1, 8, 8), size=5))
    assert seen and set(seen) == {(False, False)}
    assert (torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32) == (True, True)


@pytest.mark.parametrize("engine", [GhostClipper, PerExampleClipper])
def test_under_bf16_autocast_each_examples_clipped_gradient_stays_within_the_clip(engine):
    """``Trainer(precision="bf16-mixed")``: a one-example batch's clipped sum is that example's share; its norm stays
    at most ``max_grad_norm`` (float32 rounding aside) with either engine, every example clipped."""
    module = build("timm/resnet18", (3, 32, 32))  # at 32x32 its later stages take the ghost-norm route
    clipper = engine(module, "per_example_loss", 1e-3)
    if isinstance(clipper, GhostClipper):
        without_vmap_checks(clipper)  # the bound itself is under test, not the first-step check
    x, y = batch((3, 32, 32), size=8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        for i in range(8):
            result = clipper((x[i : i + 1], y[i : i + 1]))
            share = torch.linalg.vector_norm(torch.cat([g.flatten() for g in result.grads.values()]))
            assert result.norms.item() > 1e-3 and share.item() <= 1e-3 * (1 + 1e-5), i
    if isinstance(clipper, GhostClipper):  # its own rules did it: autocast's weight casts make no vmap fallback
        assert not clipper.fallback_names and not clipper._use_reference


class ThreeConvolutions(torch.nn.Module):
    """At batch 4 on 14x14 maps: the first convolution keeps its per-example gradients (formed after the backward),
    the second keeps them too (formed during it, streamed), the third drops them (larger than its captures)."""

    def __init__(self) -> None:
        super().__init__()
        self.convs = torch.nn.Sequential(
            torch.nn.Conv2d(3, 8, 3, padding=1),
            torch.nn.Tanh(),
            torch.nn.Conv2d(8, 64, 3, padding=1),
            torch.nn.Tanh(),
            torch.nn.Conv2d(64, 256, 3, padding=1),
        )

    def per_example_loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        logits = self.convs(x).mean(dim=(2, 3))[:, :10]
        return torch.nn.functional.cross_entropy(logits, y, reduction="none")


@pytest.mark.usefixtures("default_tf32")
def test_kept_convolution_gradients_follow_cudnns_tf32_setting_and_dropped_ones_stay_float32(monkeypatch):
    """A kept per-example weight gradient is a convolution's weight gradient whose norm and share both come from it:
    its batched product runs with cuDNN's TF32 setting (on by default, as for the non-private weight gradient), the
    matrix products' own (off by default) restored after. The dropped route's products form norms that a different
    product's share must match, and the first step's check compares with the vmap engine: both stay float32."""
    torch.manual_seed(0)
    module = ThreeConvolutions()
    ghost = GhostClipper(module, "per_example_loss", 1.0)
    seen, bmm = [], torch.bmm

    def spy(a, b):
        seen.append(((a.shape[1], b.shape[2]), torch.backends.cuda.matmul.allow_tf32))
        return bmm(a, b)

    monkeypatch.setattr(torch, "bmm", spy)
    x, y = batch((3, 14, 14), size=4)
    ghost((x, y))  # the first call: the check, then the step
    assert seen and {tf32 for _, tf32 in seen[: len(seen) // 2]} == {False}  # the check's products come first
    seen.clear()
    ghost((x, y))
    routes = {shape: tf32 for shape, tf32 in seen}
    assert routes == {(8, 27): True, (64, 72): True, (256, 576): False}, routes
    assert [rule.keeps_per_example(4) for rule in ghost.rules] == [True, True, False]
    assert (torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32) == (True, False)


def _failing_in_float32(ghost: GhostClipper, seen: list, monkeypatch) -> None:
    """Make the check's float32 comparison disagree (as float32 rounding can), recording each comparison's dtype."""
    checked = ghost._checked

    def spy(part):
        seen.append(part[0].dtype)
        result = checked(part)
        return (False, *result[1:]) if part[0].dtype == torch.float32 else result

    monkeypatch.setattr(ghost, "_checked", spy)


def test_a_float32_mismatch_is_confirmed_in_float64_leaving_the_parameters_as_they_were(monkeypatch):
    """Where the float32 comparison disagrees, the check compares again in float64, where the two engines' algebra
    agrees to 1e-13: float64 copies stand in for the parameters, which are never touched (same objects, storage and
    values; a view keeps aliasing; the hooks on their gradient accumulators, which DDP's reduction uses, still
    fire). The step itself runs in float32."""
    module = build("cnn_tanh", (1, 8, 8))
    params = dict(module.named_parameters())
    before = {name: (p.data_ptr(), p.detach().clone()) for name, p in params.items()}
    view = params["model.net.conv1.weight"][0]  # a view held elsewhere: it must keep aliasing the parameter
    weight = params["model.net.conv2.weight"]
    accumulator = weight.expand_as(weight).grad_fn.next_functions[0][0]  # DDP hooks each parameter's accumulator
    fired = []
    accumulator.register_hook(lambda *_: fired.append(True))
    ghost = GhostClipper(module, "per_example_loss", 1.0, on_mismatch="raise")
    seen = []
    _failing_in_float32(ghost, seen, monkeypatch)
    result = ghost(batch((1, 8, 8), size=5))
    assert seen == [torch.float32, torch.float64] and not ghost._use_reference and not ghost.fallback_names
    assert result.norms.dtype == torch.float32 and all(g.dtype == torch.float32 for g in result.grads.values())
    for name, p in module.named_parameters():
        assert p is params[name] and p.dtype == torch.float32 and p.data_ptr() == before[name][0]
        torch.testing.assert_close(p.detach(), before[name][1], rtol=0, atol=0)
    with torch.no_grad():
        view.add_(1.0)
    first = params["model.net.conv1.weight"][0].detach()
    torch.testing.assert_close(first, before["model.net.conv1.weight"][1][0] + 1.0)
    weight.sum().backward()
    assert fired == [True]


class FixedProjection(torch.nn.Module):
    """A linear layer, then a float32 matrix kept as a plain attribute: the model cannot run in float64."""

    def __init__(self):
        super().__init__()
        self.layer, self.head = torch.nn.Linear(6, 5), torch.nn.Linear(4, 10)
        self.projection = torch.linspace(-1, 1, 20).view(4, 5)

    def forward(self, x):
        return self.head(torch.nn.functional.linear(torch.tanh(self.layer(x.flatten(1))), self.projection))


def test_a_mismatch_that_cannot_be_checked_in_float64_stands(monkeypatch, caplog):
    torch.manual_seed(0)
    module = DPSGD(model=FixedProjection(), num_classes=10, input_shape=(1, 2, 3))
    ghost = GhostClipper(module, "per_example_loss", 0.1, on_mismatch="raise")
    seen = []
    _failing_in_float32(ghost, seen, monkeypatch)
    with caplog.at_level("INFO"), pytest.raises(EngineMismatch):
        ghost(batch((1, 2, 3), size=5))
    assert seen == [torch.float32, torch.float64] and "could not be checked in float64" in caplog.text
    assert all(p.dtype == torch.float32 for p in module.parameters())


def test_a_float32_model_whose_vmap_norms_round_apart_passes_the_check():
    """MobileNetV2 with GroupNorm at random initialization, 64x64: in float32 the vmap engine's norm of the second
    example is 0.8 % below its float64 value (the ghost engine's is within 1e-5), so a float32 check failed and
    ``auto`` ran vmap; in float64 the two engines agree."""
    torch.manual_seed(0)
    module = DPSGD(model="timm/mobilenetv2_050", num_classes=3, input_shape=(3, 64, 64))
    x, y = torch.rand(4, 3, 64, 64), torch.randint(0, 3, (4,))
    ghost = GhostClipper(module, "per_example_loss", 1.0, on_mismatch="raise")
    ghost((x, y))
    assert not ghost._use_reference and not ghost.fallback_names


class Recurrent(torch.nn.Module):
    """An LSTM over the rows of a ``[1, T, d]`` image, then a head on its last output."""

    def __init__(self):
        super().__init__()
        self.lstm, self.head = torch.nn.LSTM(3, 8, batch_first=True), torch.nn.Linear(8, 10)

    def forward(self, x):
        out, _ = self.lstm(x.squeeze(1))
        return self.head(out[:, -1])


def test_an_lstm_goes_to_vmap_under_auto_and_the_check_keeps_onednn(caplog):
    """``nn.LSTM`` returns a tuple, which no rule captures: its parameters go to the vmap engine at the first forward
    (the check's). ``torch.func``'s ``vmap`` of ``nn.LSTM`` fails outside oneDNN, so the check runs with oneDNN as
    set, and the step equals the vmap engine's."""
    from lightning_dprobust.core.engines import build_clipper

    torch.manual_seed(0)
    module = DPSGD(model=Recurrent(), num_classes=10, input_shape=(1, 5, 3))
    x, y = batch((1, 5, 3), size=6)
    clipper, choice = build_clipper("auto", module, "per_example_loss", 0.1)
    with caplog.at_level("INFO"):
        actual = clipper((x, y))
    assert choice.startswith("ghost") and "runs with oneDNN as set" in caplog.text
    assert clipper.fallback_names == [name for name, _ in module.named_parameters() if ".lstm." in name]
    expected = PerExampleClipper(module, "per_example_loss", 0.1)((x, y))
    torch.testing.assert_close(actual.norms, expected.norms)
    for name, grad in expected.grads.items():
        torch.testing.assert_close(actual.grads[name], grad)
