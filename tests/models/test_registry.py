"""Tests for the model registry: register/list/create, None-kwarg handling, errors."""

from __future__ import annotations

import pytest
import timm
import torch
from torch import nn

from lightning_dprobust.models import NormalizedModel, create_model, list_models, register_model
from lightning_dprobust.models.registry import _MODELS
from lightning_dprobust.models.timm_models import PretrainedWeightsError


class _Recorder(nn.Module):
    """A tiny network that remembers the keyword arguments its builder received."""

    def __init__(self, num_classes: int, input_shape: tuple[int, int, int], **kwargs: object) -> None:
        super().__init__()
        self.kwargs = kwargs
        self.linear = nn.Linear(input_shape[0] * input_shape[1] * input_shape[2], num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x.flatten(1))


def _builder(**kwargs: object) -> nn.Module:
    return _Recorder(**kwargs)


def test_register_duplicate_and_force() -> None:
    name = "_test_registry_dup"
    try:
        assert register_model(name)(_builder) is _builder
        assert name in list_models()
        with pytest.raises(ValueError, match="already registered"):
            register_model(name)(_builder)

        def other(**kwargs: object) -> nn.Module:
            return _Recorder(**kwargs)

        register_model(name, force=True)(other)
        assert _MODELS[name] is other
    finally:
        _MODELS.pop(name, None)
    assert name not in list_models()


@pytest.mark.parametrize("bad", ["", "timm/mine"])
def test_register_rejects_reserved_or_empty_names(bad: str) -> None:
    with pytest.raises(ValueError, match="invalid model name"):
        register_model(bad)


def test_list_models_patterns() -> None:
    ours = list_models()
    assert {"cnn_tanh", "mlp_tanh"} <= set(ours)
    assert ours == sorted(ours)
    assert not any(n.startswith("timm/") for n in ours)
    assert list_models("cnn_*") == ["cnn_tanh"]
    assert list_models("no_such_*") == []
    resnets = list_models("timm/resnet1*")
    assert "timm/resnet18" in resnets
    assert resnets == sorted("timm/" + n for n in timm.list_models("resnet1*"))
    assert len(list_models("timm/*")) == len(timm.list_models())


def test_none_kwargs_are_dropped() -> None:
    name = "_test_registry_none"
    try:
        register_model(name)(_builder)
        model = create_model(name, num_classes=3, input_shape=(1, 2, 2), width=None, depth=4)
        assert model.net.kwargs == {"depth": 4}
    finally:
        _MODELS.pop(name, None)


def test_unknown_name_lists_suggestions() -> None:
    with pytest.raises(ValueError) as info:
        create_model("cnn_tahn", num_classes=10, input_shape=(1, 28, 28))
    message = str(info.value)
    assert "unknown model 'cnn_tahn'" in message
    assert "cnn_tanh" in message
    assert "list_models" in message


def test_missing_timm_prefix_suggests_it() -> None:
    with pytest.raises(ValueError, match="timm/resnet18"):
        create_model("resnet18", num_classes=10, input_shape=(3, 32, 32))
    with pytest.raises(ValueError, match="Did you mean: timm/resnet18"):
        create_model("timm/resnt18", num_classes=10, input_shape=(3, 32, 32))


def test_wrapper_and_identity_normalization() -> None:
    model = create_model("cnn_tanh", num_classes=10, input_shape=(3, 32, 32))
    assert isinstance(model, NormalizedModel)
    assert torch.equal(model.normalize.mean.flatten(), torch.zeros(3))
    assert torch.equal(model.normalize.std.flatten(), torch.ones(3))
    x = torch.rand(2, 3, 32, 32)
    torch.testing.assert_close(model(x), model.net(x), rtol=0, atol=0)


def test_mean_std_are_applied_before_the_net() -> None:
    mean, std = (0.1, 0.2, 0.3), (0.5, 0.25, 2.0)
    model = create_model("mlp_tanh", num_classes=4, input_shape=(3, 4, 4), mean=mean, std=std)
    x = torch.rand(2, 3, 4, 4)
    expected = model.net((x - torch.tensor(mean).view(3, 1, 1)) / torch.tensor(std).view(3, 1, 1))
    torch.testing.assert_close(model(x), expected)
    assert {"normalize.mean", "normalize.std"} <= set(model.state_dict())


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(num_classes=10, input_shape=(1, 28)), "input_shape"),
        (dict(num_classes=0, input_shape=(1, 28, 28)), "num_classes"),
        (dict(num_classes=10, input_shape=(1, 28, 28), mean=(0.5, 0.5)), "mean"),
        (dict(num_classes=10, input_shape=(1, 28, 28), std=(0.5, 0.5)), "std"),
        (dict(num_classes=10, input_shape=(1, 28, 28), pretrained=True), "no pretrained weights"),
    ],
)
def test_bad_arguments_raise(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        create_model("cnn_tanh", **kwargs)


def test_timm_pretrained_failure_is_wrapped(tmp_path) -> None:
    missing = tmp_path / "missing.safetensors"
    with pytest.raises(PretrainedWeightsError, match="pretrained_cfg_overlay") as info:
        create_model(
            "timm/resnet18",
            num_classes=10,
            input_shape=(3, 32, 32),
            pretrained=True,
            pretrained_cfg_overlay=dict(file=str(missing)),
        )
    assert "could not be fetched" in str(info.value)
    assert isinstance(info.value.__cause__, OSError)


def test_timm_pretrained_from_local_file(tmp_path) -> None:
    source = timm.create_model("resnet18", num_classes=10)
    path = tmp_path / "resnet18.pth"
    torch.save(source.state_dict(), path)
    model = create_model(
        "timm/resnet18",
        num_classes=10,
        input_shape=(3, 32, 32),
        pretrained=True,
        pretrained_cfg_overlay=dict(file=str(path)),
    )
    torch.testing.assert_close(model.net.conv1.weight, source.conv1.weight, rtol=0, atol=0)
    torch.testing.assert_close(model.net.layer4[1].conv2.weight, source.layer4[1].conv2.weight, rtol=0, atol=0)
