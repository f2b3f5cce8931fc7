"""Tests for the registered paper networks (cnn_tanh, mlp_tanh)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from lightning_dprobust.models import create_model, dp_incompatibilities, list_models
from lightning_dprobust.models.cnn import CNNTanh, channels_last

SHAPES = [(1, 8, 8), (1, 28, 28), (3, 32, 32)]
DENOISERS = {"dncnn_gn"}
GENERATORS = {"ain_generator"}
"""Attack generators: they map (images, labels, bound) to images."""

# Hand-derived parameter counts for 10 classes (weights + biases):
#   1x28x28: Papernot et al. 2020 / DP-CERT / DP-Adv specs: 1,040 + 8,224 + 16,416 + 330 = 26,010.
#   3x32x32: conv1 3*16*64+16 = 3,088; conv2 8,224; map 32x5x5 -> fc1 800*32+32 = 25,632; fc2 330.
#   1x8x8 (3x3 convs): 1*16*9+16 = 160; 16*32*9+32 = 4,640; map 32x6x6 -> fc1 1152*32+32 = 36,896; fc2 330.
WITH_BATCHNORM = {
    "preact_resnet8": {"dp_compatible": True},
    "residual_perturbation": {"base_kwargs": {"dp_compatible": True}},
}
"""Models built with BatchNorm (residual perturbation's ResNet8), and the arguments of their DP-compatible variant."""
CNN_PARAMS = {(1, 28, 28): 26_010, (3, 32, 32): 37_274, (1, 8, 8): 42_026}
BATCHNORM_OPTION = {"stobatch_cnn": {"normalization": "batch"}}
"""Per-example models with a batch-normalized option (StoBatch's paper form, nominal epsilon only)."""


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("name", list_models())
def test_every_registered_model_builds_and_runs(name: str, shape: tuple[int, int, int]) -> None:
    torch.manual_seed(0)
    model = create_model(name, num_classes=7, input_shape=shape)
    images = torch.rand(3, *shape)
    logits = model.net(images, torch.arange(3), 0.1) if name in GENERATORS else model(images)
    assert logits.shape == ((3, *shape) if name in DENOISERS | GENERATORS else (3, 7))  # images to images
    assert torch.isfinite(logits).all()
    if name in BATCHNORM_OPTION:
        assert dp_incompatibilities(create_model(name, num_classes=7, input_shape=shape, **BATCHNORM_OPTION[name]))
    if name in WITH_BATCHNORM:
        assert dp_incompatibilities(model) != []
        model = create_model(name, num_classes=7, input_shape=shape, **WITH_BATCHNORM[name])
    assert dp_incompatibilities(model) == []


@pytest.mark.parametrize(("shape", "expected"), CNN_PARAMS.items())
def test_cnn_tanh_parameter_counts(shape: tuple[int, int, int], expected: int) -> None:
    model = create_model("cnn_tanh", num_classes=10, input_shape=shape)
    assert sum(p.numel() for p in model.net.parameters()) == expected


def test_cnn_tanh_mnist_layer_shapes_match_papernot() -> None:
    net = create_model("cnn_tanh", num_classes=10, input_shape=(1, 28, 28)).net
    seen = {}

    def record(name: str):
        def hook(module: torch.nn.Module, inputs: tuple, output: torch.Tensor) -> None:
            seen[name] = tuple(output.shape[1:])

        return hook

    for name in ("pool1", "pool2", "fc1"):
        getattr(net, name).register_forward_hook(record(name))
    net(torch.rand(2, 1, 28, 28))
    assert seen == {"pool1": (16, 13, 13), "pool2": (32, 4, 4), "fc1": (32,)}
    assert (net.conv1.kernel_size, net.conv1.stride, net.conv1.padding) == ((8, 8), (2, 2), (3, 3))
    assert (net.conv2.kernel_size, net.conv2.stride, net.conv2.padding) == ((4, 4), (2, 2), (0, 0))


def test_cnn_tanh_output_is_bounded_tanh_features() -> None:
    net = create_model("cnn_tanh", num_classes=10, input_shape=(1, 28, 28)).net
    with torch.no_grad():
        net.fc2.weight.fill_(1.0)
        net.fc2.bias.zero_()
        logits = net(100 * torch.randn(4, 1, 28, 28))
    assert logits.abs().max() <= 32  # 32 tanh units, each in [-1, 1]


def test_cnn_tanh_large_input_and_kwargs() -> None:
    model = create_model("cnn_tanh", num_classes=5, input_shape=(3, 64, 64), hidden=None, channels=(8, 16))
    assert model.net.conv1.out_channels == 8 and model.net.fc1.out_features == 32
    assert model(torch.rand(2, 3, 64, 64)).shape == (2, 5)


def _nchw_reference(p: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """``CNNTanh`` (1x28x28 geometry) with contiguous NCHW maps throughout."""
    x = F.max_pool2d(torch.tanh(F.conv2d(x, p["conv1.weight"], p["conv1.bias"], 2, 3)), 2, 1)
    x = F.max_pool2d(torch.tanh(F.conv2d(x, p["conv2.weight"], p["conv2.bias"], 2)), 2, 1)
    return F.linear(torch.tanh(F.linear(x.flatten(1), p["fc1.weight"], p["fc1.bias"])), p["fc2.weight"], p["fc2.bias"])


def test_cnn_tanh_channels_last_maps_give_the_nchw_outputs_and_gradients() -> None:
    torch.manual_seed(0)
    model = CNNTanh(10, (1, 28, 28))
    params = {name: p.detach() for name, p in model.named_parameters()}
    x = torch.randn(6, 1, 28, 28)

    def loss(p, inputs, forward):
        return forward(p, inputs).square().sum()

    def shipped(p, inputs):
        return torch.func.functional_call(model, p, (inputs,))

    torch.testing.assert_close(shipped(params, x), _nchw_reference(params, x))
    want = torch.func.grad(loss)(params, x, _nchw_reference)
    got = torch.func.grad(loss)(params, x, shipped)
    per_example = torch.func.vmap(torch.func.grad(loss), in_dims=(None, 0, None))(params, x[:, None], shipped)
    for name in params:
        torch.testing.assert_close(got[name], want[name], rtol=1e-4, atol=1e-6)
        torch.testing.assert_close(per_example[name].sum(0), want[name], rtol=1e-4, atol=1e-6)


def test_pooling_channels_last_maps_routes_gradients_like_nchw_ties_included() -> None:
    """Saturated tanh maps hold many exact ties in the pooling windows: the gradient must reach the element the NCHW
    kernel picks, also per example under ``vmap`` (the vmap engine runs the model there)."""
    generator = torch.Generator().manual_seed(0)
    maps = torch.tanh(20 * torch.randn(6, 16, 14, 14, generator=generator))
    assert (maps.abs() == 1).float().mean() > 0.2
    upstream = torch.randn(6, 16, 13, 13, generator=generator)
    assert channels_last(maps).is_contiguous(memory_format=torch.channels_last)

    def pooled(inputs, weights, layout):
        return (F.max_pool2d(layout(inputs), 2, 1) * weights).sum()

    want = torch.func.grad(pooled)(maps, upstream, lambda t: t)
    got = torch.func.grad(pooled)(maps, upstream, channels_last)
    per_example = torch.func.vmap(torch.func.grad(pooled), in_dims=(0, 0, None))(
        maps[:, None], upstream[:, None], channels_last
    )
    assert torch.equal(got, want) and torch.equal(per_example[:, 0], want)


def test_cnn_tanh_rejects_tiny_images() -> None:
    with pytest.raises(ValueError, match="H, W >= 3"):
        create_model("cnn_tanh", num_classes=10, input_shape=(1, 2, 8))


@pytest.mark.parametrize("shape", SHAPES)
def test_dncnn_slices_and_parameter_count(shape: tuple[int, int, int]) -> None:
    channels = shape[0]
    model = create_model("dncnn_gn", num_classes=10, input_shape=shape, width=16, depth=4, groups=4).net
    first, middle, last = (sum(p.numel() for p in m.parameters()) for m in (model.first, model.middle, model.last))
    assert (first, last) == (channels * 16 * 9 + 16, 16 * channels * 9 + channels)
    assert middle == 2 * (16 * 16 * 9 + 2 * 16)  # two bias-free 3x3 convolutions, each with GroupNorm
    with pytest.raises(ValueError, match="divide"):
        create_model("dncnn_gn", num_classes=10, input_shape=shape, width=16, groups=5)
