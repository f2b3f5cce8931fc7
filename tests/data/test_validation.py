"""``check_batch``: every batch that breaks the data contract is refused with a message naming the problem."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from lightning_dprobust.data.validation import check_batch

SHAPE = (1, 8, 8)


def images(n: int = 4) -> torch.Tensor:
    return torch.rand(n, *SHAPE, generator=torch.Generator().manual_seed(0))


def labels(n: int = 4) -> torch.Tensor:
    return torch.arange(n) % 10


@pytest.mark.parametrize(
    ("x", "y"),
    [
        (images(), labels()),
        (images(0), labels(0)),  # an empty Poisson batch
        (torch.zeros(2, *SHAPE), torch.tensor([0, 9])),  # both ends of both ranges
        (torch.ones(2, *SHAPE), torch.tensor([9, 0], dtype=torch.int32)),
        (images(3), torch.tensor([[0.0] * 10, [1.0] * 10, [0.5] * 10])),  # multi-label targets
    ],
    ids=["plain", "empty", "zeros", "ones-int32", "multilabel"],
)
def test_valid_batches_pass(x, y):
    check_batch(x, y, 10, SHAPE)


def with_nan(x: torch.Tensor) -> torch.Tensor:
    x = x.clone()
    x[2, 0, 3, 3] = float("nan")
    return x


@pytest.mark.parametrize(
    ("x", "y", "message"),
    [
        (with_nan(images()), labels(), r"1 NaN or infinite pixel values in 1 image\(s\) .*positions \[2\]"),
        (images().index_fill(0, torch.tensor([1]), float("inf")), labels(), r"64 NaN or infinite .*positions \[1\]"),
        (
            images().index_fill(3, torch.tensor([0]), -2.0),
            labels(),
            r"span \[-2, 0.9\d+\], outside \[0, 1\].*Normalize",
        ),
        (images() * 255, labels(), r"outside \[0, 1\].*divide 8-bit images by 255"),
        (images(), labels() + 7, r"labels span \[7, 10\] but the model has 10 classes.*\[0, 10\)"),
        (images(), labels() - 1, r"labels span \[-1, 2\]"),
        (F.pad(images(), (1, 1, 1, 1)), labels(), r"images of shape \(1, 10, 10\).*built for \(1, 8, 8\)"),
        (images().expand(4, 3, 8, 8), labels(), r"images of shape \(3, 8, 8\)"),
        (images()[:, 0], labels(), r"images of shape \(8, 8\)"),
        ((images() * 255).to(torch.uint8), labels(), r"dtype torch.uint8.*float images"),
        (images(), labels(3), r"labels of shape \(3,\).*for 4 images"),
        (images(), labels().float(), r"labels of shape \(4,\) and dtype torch.float32"),
        (images(), torch.full((4, 10), 2.0), r"multi-label targets span \[2, 2\]"),
        (images(), torch.full((4, 10), float("nan")), r"multi-label targets span \[nan, nan\]"),
    ],
    ids=[
        "nan",
        "inf",
        "normalized",
        "0-255",
        "label-too-big",
        "label-negative",
        "wrong-size",
        "wrong-channels",
        "no-channel-dim",
        "uint8-images",
        "label-count",
        "float-class-indices",
        "multilabel-range",
        "multilabel-nan",
    ],
)
def test_invalid_batches_are_refused_naming_the_problem(x, y, message):
    with pytest.raises(ValueError, match=message):
        check_batch(x, y, 10, SHAPE)


def test_what_check_batch_refuses_would_otherwise_fail_late_or_silently():
    """The failures check_batch prevents: a late index error, and a NaN that spreads to the loss."""
    with pytest.raises(IndexError):
        F.cross_entropy(torch.zeros(4, 10), labels() + 7)
    linear = torch.nn.Linear(64, 10)
    assert F.cross_entropy(linear(with_nan(images()).flatten(1)), labels()).isnan()
