"""Per-example gradients on timm models built through the registry.

timm ResNets add the shortcut in place (``x += shortcut``). Per-example gradients by ``torch.func`` (vmap of grad)
handle that; Opacus 1.6's backward hooks do not (meta-pytorch/opacus#828).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from opacus import GradSampleModule
from torch.func import functional_call, grad, vmap

from lightning_dprobust.models import create_model, dp_incompatibilities


@pytest.fixture
def resnet18() -> torch.nn.Module:
    torch.manual_seed(0)
    return create_model("timm/resnet18", num_classes=10, input_shape=(3, 32, 32), mean=(0.5,) * 3, std=(0.25,) * 3)


def test_timm_model_is_dp_compatible(resnet18: torch.nn.Module) -> None:
    assert dp_incompatibilities(resnet18) == []
    assert resnet18(torch.rand(2, 3, 32, 32)).shape == (2, 10)


def test_per_example_gradients_match_one_at_a_time(resnet18: torch.nn.Module) -> None:
    model = resnet18.train()
    x, y = torch.rand(4, 3, 32, 32), torch.tensor([0, 3, 7, 9])
    params = {k: v.detach() for k, v in model.named_parameters()}
    buffers = {k: v.detach() for k, v in model.named_buffers()}

    def loss(p: dict, xi: torch.Tensor, yi: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(functional_call(model, (p, buffers), (xi.unsqueeze(0),)), yi.unsqueeze(0))

    per_example = vmap(grad(loss), in_dims=(None, 0, 0))(params, x, y)
    for i in range(len(x)):
        model.zero_grad()
        F.cross_entropy(model(x[i : i + 1]), y[i : i + 1]).backward()
        for name, p in model.named_parameters():
            torch.testing.assert_close(per_example[name][i], p.grad, rtol=0, atol=1e-5, msg=f"{name}, example {i}")


def test_opacus_hooks_fail_on_timm_resnet(resnet18: torch.nn.Module) -> None:
    """Opacus 1.6 ``hooks`` mode breaks on the in-place residual add, even with every ``inplace`` flag off.

    If this test starts failing, Opacus fixed #828: hooks mode then becomes an option for timm ResNets.
    """
    gsm = GradSampleModule(resnet18.train())
    with pytest.raises(RuntimeError, match="inplace|view"):
        F.cross_entropy(gsm(torch.rand(4, 3, 32, 32)), torch.tensor([0, 1, 2, 3])).backward()
