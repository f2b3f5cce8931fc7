"""Tests for make_dp_compatible and dp_incompatibilities."""

from __future__ import annotations

import pytest
import timm
import torch
from timm.layers import BatchNormAct2d, GroupNormAct
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from lightning_dprobust.models import Normalize, NormalizedModel, dp_incompatibilities, make_dp_compatible

FIX = "lightning_dprobust.models.make_dp_compatible"


def _has_inplace(model: nn.Module) -> bool:
    return any(getattr(m, "inplace", False) is True for m in model.modules())


def test_unfixed_timm_resnet18_lists_batchnorms_by_name() -> None:
    model = NormalizedModel(Normalize([0.0] * 3, [1.0] * 3), timm.create_model("resnet18", num_classes=10))
    problems = dp_incompatibilities(model)
    bn_names = [n for n, m in model.named_modules() if type(m) is nn.BatchNorm2d]
    assert len(bn_names) == 20  # stem + 2 per basic block (8 blocks) + 3 downsample shortcuts
    for name in bn_names:
        assert f"{name}: BatchNorm2d mixes examples of a batch (replace with GroupNorm: {FIX})" in problems
    assert "net.layer1.0.bn1: BatchNorm2d mixes examples of a batch (replace with GroupNorm: " + FIX + ")" in problems
    assert any(p.startswith("net.act1: ReLU has inplace=True") for p in problems)
    assert dp_incompatibilities(model.normalize) == []


@pytest.mark.parametrize("arch", ["resnet18", "efficientnet_b0", "mobilenetv3_small_050"])
def test_make_dp_compatible_on_timm(arch: str) -> None:
    torch.manual_seed(0)
    model = timm.create_model(arch, num_classes=10)
    assert _has_inplace(model) and any(isinstance(m, _BatchNorm) for m in model.modules())
    fused = {n: (m.act, m.drop) for n, m in model.named_modules() if isinstance(m, BatchNormAct2d)}
    assert (arch == "resnet18") == (not fused)
    assert make_dp_compatible(model) is model
    assert dp_incompatibilities(model) == []
    assert not any(isinstance(m, _BatchNorm) for m in model.modules())
    assert not _has_inplace(model)
    for name, (act, drop) in fused.items():
        replaced = model.get_submodule(name)
        assert isinstance(replaced, GroupNormAct) and replaced.act is act and replaced.drop is drop
    logits = model.train()(torch.rand(2, 3, 32, 32))
    assert logits.shape == (2, 10) and torch.isfinite(logits).all()


def test_replacement_is_group_norm_with_gcd_groups() -> None:
    model = nn.Sequential(nn.Conv2d(3, 24, 3), nn.BatchNorm2d(24, affine=False), nn.ReLU(inplace=True))
    make_dp_compatible(model, num_groups=32)
    gn = model[1]
    assert type(gn) is nn.GroupNorm
    assert (gn.num_groups, gn.num_channels, gn.affine) == (8, 24, True)
    assert model[2].inplace is False


def test_fixed_model_treats_examples_independently() -> None:
    torch.manual_seed(0)
    model = make_dp_compatible(nn.Sequential(nn.Conv2d(1, 8, 3), nn.BatchNorm2d(8), nn.Flatten(), nn.Linear(288, 2)))
    x = torch.randn(4, 1, 8, 8)
    y = x.clone()
    y[1:] = 5 * torch.randn(3, 1, 8, 8)
    torch.testing.assert_close(model(x)[0], model(y)[0])


def test_batchnorm_subclasses_and_1d() -> None:
    model = nn.Sequential(nn.Linear(4, 6), nn.BatchNorm1d(6), nn.SyncBatchNorm(6))
    assert len(dp_incompatibilities(model)) == 2
    make_dp_compatible(model, num_groups=4)
    assert [type(m) for m in model] == [nn.Linear, nn.GroupNorm, nn.GroupNorm]
    assert model[1].num_groups == 2
    assert model(torch.randn(3, 4)).shape == (3, 6)


def test_root_batchnorm_returns_replacement_and_keeps_dtype() -> None:
    bn = nn.BatchNorm2d(16).double()
    fixed = make_dp_compatible(bn)
    assert type(fixed) is nn.GroupNorm and fixed.weight.dtype == torch.float64
    assert dp_incompatibilities(bn) == [
        "(root): BatchNorm2d mixes examples of a batch (replace with GroupNorm: " + FIX + ")"
    ]


def test_shared_batchnorm_stays_shared() -> None:
    bn = nn.BatchNorm2d(4)
    model = nn.ModuleDict({"a": nn.Sequential(bn), "b": nn.Sequential(bn)})
    make_dp_compatible(model)
    assert model["a"][0] is model["b"][0]
    assert isinstance(model["a"][0], nn.GroupNorm)


def test_instance_norm_running_stats() -> None:
    model = nn.Sequential(nn.InstanceNorm2d(3, track_running_stats=True), nn.InstanceNorm2d(3))
    assert dp_incompatibilities(model) == [
        "0: InstanceNorm2d tracks running statistics across examples (set track_running_stats=False: " + FIX + ")"
    ]
    make_dp_compatible(model)
    assert dp_incompatibilities(model) == []
    x = torch.randn(2, 3, 5, 5)
    torch.testing.assert_close(model.eval()(x), nn.functional.instance_norm(x))


def test_bad_num_groups() -> None:
    with pytest.raises(ValueError, match="num_groups"):
        make_dp_compatible(nn.BatchNorm2d(4), num_groups=0)


def test_an_embedding_that_renormalizes_or_is_sparse_is_flagged_and_fixed() -> None:
    """``max_norm`` renormalizes, in place and without noise, the rows a batch looks up (the released table would
    show which tokens the batch held); ``sparse=True`` gradients cannot be formed per example by vmap."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(10, 4, max_norm=0.5), nn.Embedding(10, 4, sparse=True), nn.Embedding(10, 4))
    before = model[0].weight.detach().clone()
    model[0](torch.tensor([3]))
    changed = (model[0].weight.detach() != before).any(dim=1)
    assert changed.tolist() == [row == 3 for row in range(10)]  # the leak the check is for
    problems = dp_incompatibilities(model)
    assert len(problems) == 2
    assert problems[0].startswith("0: Embedding has max_norm=0.5: it renormalizes the rows each batch looks up")
    assert problems[1].startswith("1: Embedding has sparse=True") and FIX in problems[1]
    make_dp_compatible(model)
    assert dp_incompatibilities(model) == []
    assert [(m.max_norm, m.sparse) for m in model] == [(None, False)] * 3
