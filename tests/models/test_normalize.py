"""Tests for the input normalization layer and its wrapper."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from lightning_dprobust.models import Normalize, NormalizedModel


def test_output_equals_standardization() -> None:
    mean, std = [0.4914, 0.4822, 0.4465], [0.2470, 0.2435, 0.2616]
    x = torch.rand(5, 3, 6, 7)
    expected = torch.stack([(x[:, c] - mean[c]) / std[c] for c in range(3)], dim=1)
    torch.testing.assert_close(Normalize(mean, std)(x), expected)


def test_gradient_flows_to_input_and_input_is_untouched() -> None:
    std = [0.5, 2.0]
    x = torch.rand(3, 2, 4, 4, requires_grad=True)
    before = x.detach().clone()
    Normalize([0.1, 0.2], std)(x).sum().backward()
    assert torch.equal(x.detach(), before)
    expected = torch.tensor([1 / s for s in std]).view(1, 2, 1, 1).expand_as(x)
    torch.testing.assert_close(x.grad, expected)


def test_stats_are_buffers_not_parameters() -> None:
    norm = Normalize([0.5], [0.25])
    assert list(norm.parameters()) == []
    assert set(norm.state_dict()) == {"mean", "std"}


@pytest.mark.parametrize(
    ("mean", "std", "match"),
    [([], [], "one value per channel"), ([0.0], [1.0, 1.0], "same length"), ([0.0], [0.0], "> 0")],
)
def test_bad_statistics_raise(mean: list, std: list, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        Normalize(mean, std)


def test_channel_mismatch_raises() -> None:
    with pytest.raises(ValueError, match=r"\(\.\.\., 3, H, W\)"):
        Normalize([0.0] * 3, [1.0] * 3)(torch.rand(2, 1, 4, 4))


def test_normalized_model_composes_in_order() -> None:
    net = nn.Flatten()
    model = NormalizedModel(Normalize([1.0], [2.0]), net)
    assert model.normalize is model[0] and model.net is net
    x = torch.rand(2, 1, 3, 3)
    torch.testing.assert_close(model(x), ((x - 1.0) / 2.0).flatten(1))
