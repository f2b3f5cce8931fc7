"""Residual perturbation wrapper and ResNet8 (spec items 1-8)."""

from __future__ import annotations

import warnings

import pytest
import torch

from lightning_dprobust.core.sampling import keyed_generator
from lightning_dprobust.models import Ensemble, PerturbedResidualNet, create_model, residual_blocks
from lightning_dprobust.models.resnet8 import PreActBlock


def resnet8(shape=(3, 8, 8), **kwargs):
    torch.manual_seed(0)
    return create_model("preact_resnet8", num_classes=10, input_shape=shape, **kwargs)


def wrap(model, seed=0, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return PerturbedResidualNet(model, seed=seed, **kwargs)


@pytest.mark.parametrize("strategy", ["additive", "multiplicative"])
def test_gamma_zero_is_the_plain_network_bitwise(strategy):
    plain, noisy = resnet8().eval(), wrap(resnet8(), strategy=strategy).eval()
    noisy.model.load_state_dict(plain.state_dict())
    x = torch.rand(4, 3, 8, 8)
    assert torch.equal(noisy(x), plain(x)) and noisy.draws == 0
    assert set(noisy.model.state_dict()) == set(plain.state_dict())


def test_noise_active_in_eval_and_switchable():
    noisy = wrap(resnet8(), gamma=0.5, input_noise=0.25).eval()
    x = torch.rand(4, 3, 8, 8)
    assert not torch.equal(noisy(x), noisy(x))
    noisy.noise_at_eval = False
    assert torch.equal(noisy(x), noisy(x))
    assert not torch.equal(noisy.train()(x), noisy(x))


def _block_difference(gamma, strategy="additive", eta=0.0, shape=(2, 16, 32, 32)):
    """Noisy minus clean output of the first ResNet8 block (16 -> 16, no projection) on a fixed input."""
    net = resnet8()
    noisy = wrap(net, strategy=strategy, gamma=gamma, eta=eta).eval()
    block = residual_blocks(net)[0]
    x = torch.randn(shape)
    x[0, 0] = 0.0
    with torch.no_grad():
        noisy.noise_at_eval = False
        clean = block(x)
        noisy.noise_at_eval = True
        return block(x) - clean, x


def test_strategy_one_statistics():
    diff, _ = _block_difference(0.3)
    assert diff.numel() > 3e4
    assert diff.std().item() == pytest.approx(0.3, rel=0.03)
    assert abs(diff.mean().item()) < 0.01
    noisy = wrap(resnet8(), gamma=0.6, input_noise=0.3).eval()
    seen = []
    noisy.model.register_forward_pre_hook(lambda _m, args: seen.append(args[0]))
    image = torch.full((64, 3, 8, 8), 0.5)
    with torch.no_grad():
        noisy(image)
    assert (seen[0] - image).std().item() == pytest.approx(0.3, rel=0.03)


def test_strategy_two_statistics_and_eta_floor():
    diff, x = _block_difference(0.4, "multiplicative")
    nonzero = x.abs() > 0.1
    assert (diff[nonzero] / x[nonzero]).std().item() == pytest.approx(0.4, rel=0.03)
    assert torch.equal(diff[0, 0], torch.zeros_like(diff[0, 0]))
    diff, x = _block_difference(0.4, "multiplicative", eta=0.5)
    small = x.abs() < 0.5
    assert (diff[small] / 0.5).std().item() == pytest.approx(0.4, rel=0.03)
    assert diff[0, 0].std().item() == pytest.approx(0.4 * 0.5, rel=0.05)


def test_strategy_two_uses_projected_input_when_shape_changes():
    net = resnet8()
    noisy = wrap(net, strategy="multiplicative", gamma=0.4).eval()
    block = residual_blocks(net)[1]
    captured = []
    block.skip_path.register_forward_hook(lambda _m, _i, out: captured.append(out))
    x = torch.randn(4, 16, 8, 8)
    with torch.no_grad():
        noisy.noise_at_eval = False
        clean = block(x)
        noisy.noise_at_eval = True
        diff = block(x) - clean
    ratio = diff / captured[-1]
    assert diff.shape == captured[-1].shape == (4, 32, 4, 4)
    assert ratio[captured[-1].abs() > 0.1].std().item() == pytest.approx(0.4, rel=0.1)


@pytest.mark.parametrize(("input_noise", "expected"), [(0.0, 3), (0.1, 4)])
def test_injection_count_per_member(input_noise, expected):
    members = [wrap(resnet8(), seed=k, gamma=0.2, input_noise=input_noise) for k in range(3)]
    Ensemble(members)(torch.rand(2, 3, 8, 8))
    assert [m.draws for m in members] == [expected] * 3


def test_timm_resnet_is_perturbed_without_copy():
    model = create_model("timm/resnet18", num_classes=10, input_shape=(3, 32, 32))
    noisy = wrap(model, gamma=0.2).eval()
    assert noisy.model is model
    x = torch.rand(2, 3, 32, 32)
    assert not torch.equal(noisy(x), noisy(x)) and noisy.draws == 2 * len(residual_blocks(model)) == 16


def test_ensemble_mean_of_member_logits_and_distinct_init():
    x = torch.rand(3, 3, 8, 8)
    members = [
        wrap(create_model("preact_resnet8", num_classes=10, input_shape=(3, 8, 8)), seed=k, gamma=0.3).eval()
        for k in range(4)
    ]
    twins = [wrap(resnet8(), seed=k, gamma=0.3).eval() for k in range(4)]
    for member, twin in zip(members, twins, strict=False):
        twin.model.load_state_dict(member.model.state_dict())
    expected = torch.stack([t(x) for t in twins]).mean(0)
    assert torch.allclose(Ensemble(members)(x), expected, atol=1e-6)
    assert torch.equal(Ensemble([twins[0]])(x), members[0](x))
    first = [m.model.net.conv.weight for m in members]
    assert all(not torch.equal(first[0], w) for w in first[1:])


def test_ensemble_probabilities_combine_is_log_mean_softmax():
    a, b = resnet8().eval(), resnet8().eval()
    x = torch.rand(2, 3, 8, 8)
    out = Ensemble([a, b], combine="probabilities")(x)
    assert torch.allclose(out.exp(), (a(x).softmax(-1) + b(x).softmax(-1)) / 2, atol=1e-6)


def test_skip_false_ablation():
    net = create_model("preact_resnet8", num_classes=10, input_shape=(3, 8, 8), skip=False).net
    blocks = [m for m in net.modules() if isinstance(m, PreActBlock)]
    assert all(b.shortcut is None for b in blocks) and len(blocks) == 3
    with_skip = resnet8().net
    projection = sum(b.shortcut.weight.numel() for b in residual_blocks(with_skip) if b.shortcut is not None)
    assert sum(p.numel() for p in with_skip.parameters()) - sum(p.numel() for p in net.parameters()) == projection
    block = blocks[0].eval()
    x = torch.randn(2, 16, 8, 8)
    residual = block.conv2(torch.relu(block.bn2(block.conv1(torch.relu(block.bn1(x))))))
    assert torch.equal(block(x), residual)
    noisy = wrap(net, gamma=0.3)
    assert noisy(torch.rand(2, 3, 8, 8)).shape == (2, 10)


@pytest.mark.parametrize("shape", [(3, 32, 32), (3, 50, 50), (1, 8, 8)])
def test_resnet8_shapes_and_parameter_count(shape):
    model = create_model("preact_resnet8", num_classes=10, input_shape=shape)
    assert model(torch.rand(2, *shape)).shape == (2, 10)
    if shape[0] == 3:
        assert sum(p.numel() for p in model.net.parameters()) == 77_850


def test_bad_inputs_refused():
    with pytest.raises(ValueError, match="strategy"):
        wrap(resnet8(), strategy="both")
    with pytest.raises(ValueError, match="gamma"):
        wrap(resnet8(), gamma=-1.0)
    with pytest.raises(ValueError, match="no residual block"):
        wrap(create_model("cnn_tanh", num_classes=10, input_shape=(1, 8, 8)))
    with pytest.warns(UserWarning, match="test mode"):
        noisy = PerturbedResidualNet(resnet8(), gamma=0.1, seed=3)
    with pytest.raises(ValueError, match="already perturbed"):
        wrap(noisy.model)


def test_noise_is_independent_of_global_seed():
    """Two wrappers without a seed draw different noise even under the same global torch seed."""
    outputs = []
    for _ in range(2):
        noisy = PerturbedResidualNet(resnet8(), gamma=0.5).eval()
        torch.manual_seed(0)
        outputs.append(noisy(torch.ones(1, 3, 8, 8)))
    assert not torch.equal(*outputs)


def test_the_noise_stream_is_keyed_by_the_whole_seed():
    """The wrapper's noise comes from a generator whose whole state follows from its seed (a ``manual_seed`` would
    keep 32 bits of it on CPU: one of 2^32 streams to search); a secret seed has 128 bits."""
    noisy = wrap(resnet8(), gamma=0.5, seed=2**40 + 7)
    like = torch.zeros(2, 16, 8, 8)
    expected = torch.randn(like.shape, generator=keyed_generator("cpu", 2**40 + 7, 0))
    assert torch.equal(noisy._noise(like), expected)
    assert PerturbedResidualNet(resnet8(), gamma=0.5)._seed.bit_length() > 64  # 128 random bits (fails w.p. 2^-64)
