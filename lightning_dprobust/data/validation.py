"""Checks that a batch honours the data contract (docs/design.md, contract 1) before a model or a DP step sees it.

A bad batch otherwise fails late and cryptically, or not at all: a label past the last class raises an index error
deep inside the loss (a device-side assert on CUDA), an image of the wrong size a matrix-shape error, and one NaN
pixel makes every clipped gradient of the DP step NaN, so the model silently becomes NaN.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor


def check_batch(x: Tensor, y: Tensor, num_classes: int, input_shape: Sequence[int]) -> None:
    """Raise ``ValueError`` naming the problem and its fix unless ``(x, y)`` is a valid classification batch.

    Valid means: ``x`` is a floating tensor of shape ``(B, *input_shape)`` whose values are finite and lie in
    ``[0, 1]``; ``y`` holds ``B`` integer class indices in ``[0, num_classes)``, or (multi-label) is a floating
    ``(B, num_classes)`` tensor with values in ``[0, 1]``. An empty batch (``B = 0``, which Poisson sampling can draw)
    is valid. The values are checked with one device synchronization.

    Args:
        x: images.
        y: labels.
        num_classes: number of classes of the model.
        input_shape: ``(C, H, W)`` of one image, as the model was built for.

    Raises:
        ValueError: for a wrong image shape or dtype, a wrong label shape or dtype, non-finite or out-of-range pixel
            values, or labels outside ``[0, num_classes)``.

    Example:
        >>> check_batch(torch.rand(4, 1, 8, 8), torch.tensor([0, 3, 9, 1]), 10, (1, 8, 8))
        >>> check_batch(torch.rand(4, 1, 8, 8), torch.tensor([0, 3, 10, 1]), 10, (1, 8, 8))  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        ValueError: labels span [0, 10] but the model has 10 classes: labels must be class indices in [0, 10)...
    """
    _check_shapes(x, y, num_classes, tuple(input_shape))
    if len(x) == 0:
        return
    finite, low, high = torch.isfinite(x).all(), x.amin(), x.amax()
    y_low, y_high = y.amin(), y.amax()
    finite, low, high, y_low, y_high = torch.stack(
        [finite.double(), low.double(), high.double(), y_low.double(), y_high.double()]
    ).tolist()
    if not finite:
        raise ValueError(_non_finite_message(x))
    if low < 0 or high > 1:
        raise ValueError(
            f"pixel values span [{low:.4g}, {high:.4g}], outside [0, 1]: data modules must yield unnormalized images "
            "in [0, 1] (normalization is the model's first layer, so attack eps and smoothing sigma are in pixel "
            "units); remove Normalize from the dataset's transforms, or divide 8-bit images by 255"
        )
    if y.is_floating_point() and (not 0 <= y_low <= y_high <= 1):
        raise ValueError(
            f"multi-label targets span [{y_low:.4g}, {y_high:.4g}]: each must be 0 or 1 (or a probability in [0, 1])"
        )
    if not y.is_floating_point() and (y_low < 0 or y_high >= num_classes):
        raise ValueError(
            f"labels span [{int(y_low)}, {int(y_high)}] but the model has {num_classes} classes: labels must be class "
            f"indices in [0, {num_classes}). Fix the dataset's labels (e.g. 1-based labels: subtract 1), or set "
            "num_classes to the data module's"
        )


def _check_shapes(x: Tensor, y: Tensor, num_classes: int, input_shape: tuple[int, ...]) -> None:
    if tuple(x.shape[1:]) != input_shape:
        raise ValueError(
            f"images of shape {tuple(x.shape[1:])} (batch {tuple(x.shape)}) but the model was built for "
            f"{input_shape}: use the data module the model was built for (the CLI links data.input_shape into the "
            "model), or build the model with this input_shape"
        )
    if not x.is_floating_point():
        raise ValueError(
            f"images have dtype {x.dtype}: data modules must yield float images in [0, 1] (e.g. torchvision's "
            "ToTensor, or uint8 / 255)"
        )
    multilabel = y.is_floating_point()
    expected = (len(x), num_classes) if multilabel else (len(x),)
    if tuple(y.shape) != expected or not (multilabel or y.dtype in _INTEGER_DTYPES):
        raise ValueError(
            f"labels of shape {tuple(y.shape)} and dtype {y.dtype} for {len(x)} images: expected {len(x)} integer "
            f"class indices, or a float ({len(x)}, {num_classes}) multi-label matrix"
        )


def _non_finite_message(x: Tensor) -> str:
    bad = ~torch.isfinite(x.flatten(1))
    examples = bad.any(dim=1).nonzero().flatten().tolist()
    return (
        f"{int(bad.sum())} NaN or infinite pixel values in {len(examples)} image(s) of the batch (batch positions "
        f"{examples[:5]}): one such image makes every clipped gradient, and so the whole model, NaN. Fix the dataset "
        "or transform that produces them (images must be finite and in [0, 1])"
    )


_INTEGER_DTYPES = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)

__all__ = ["check_batch"]
