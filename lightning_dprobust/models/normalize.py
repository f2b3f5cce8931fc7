"""Input normalization as the model's first layer.

Data modules yield unnormalized images in ``[0, 1]`` (docs/design.md, contract 1), so attack budgets ``eps`` and
smoothing ``sigma`` are in pixel units. The per-channel standardization that a network was trained with therefore
lives inside the model, as in Cohen et al. 2019 (https://arxiv.org/abs/1902.02918), whose ``NormalizeLayer`` puts it
in front of the base classifier for the same reason.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

import torch
from torch import nn


class Normalize(nn.Module):
    """Per-channel standardization ``(x - mean) / std`` of images in ``[0, 1]``.

    Guarantees: the output is a new tensor (the input is never modified in place), the map is differentiable with
    respect to the input (attacks and certification take gradients through it), and ``mean``/``std`` are stored as
    buffers, so they travel with ``state_dict`` checkpoints and ``.to(device)``. It has no trainable parameters and
    treats every example on its own, so it is compatible with per-example gradient clipping.

    Args:
        mean: one value per channel.
        std: one value per channel, each strictly positive.

    Shape:
        - Input: ``(..., C, H, W)`` with ``C == len(mean)``.
        - Output: same shape as the input.

    Raises:
        ValueError: if ``mean`` and ``std`` are empty, differ in length, or ``std`` has a non-positive entry.

    Example:
        >>> norm = Normalize(mean=(0.5,), std=(0.25,))
        >>> norm(torch.ones(1, 1, 2, 2)).flatten().tolist()
        [2.0, 2.0, 2.0, 2.0]
    """

    mean: torch.Tensor
    std: torch.Tensor

    def __init__(self, mean: Sequence[float], std: Sequence[float]) -> None:
        super().__init__()
        mean_t = torch.as_tensor(mean, dtype=torch.float32).flatten()
        std_t = torch.as_tensor(std, dtype=torch.float32).flatten()
        if mean_t.numel() == 0 or mean_t.shape != std_t.shape:
            raise ValueError(
                f"mean and std need one value per channel and the same length, got mean={list(mean)} and "
                f"std={list(std)}: pass e.g. mean=(0.5, 0.5, 0.5), std=(0.25, 0.25, 0.25) for 3 channels"
            )
        if not bool((std_t > 0).all()):
            raise ValueError(f"every std entry must be > 0, got std={list(std)}: division by it would blow up")
        self.register_buffer("mean", mean_t.view(-1, 1, 1))
        self.register_buffer("std", std_t.view(-1, 1, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Return ``(x - mean) / std`` with channels on dimension ``-3``."""
        if x.dim() < 3 or x.shape[-3] != self.mean.shape[0]:
            raise ValueError(
                f"Normalize expects images shaped (..., {self.mean.shape[0]}, H, W), got {tuple(x.shape)}: "
                "check that the model's input_shape matches the data"
            )
        return (x - self.mean) / self.std

    def extra_repr(self) -> str:
        """Show the per-channel statistics."""
        return f"mean={self.mean.flatten().tolist()}, std={self.std.flatten().tolist()}"


class NormalizedModel(nn.Sequential):
    """A network behind its input normalization: ``net(normalize(x))`` for images ``x`` in ``[0, 1]``.

    It is an ``nn.Sequential`` with two named children, so qualified module names read ``normalize.*`` and
    ``net.*`` (for example ``net.layer1.0.conv1``) and checkpoints store the normalization statistics next to the
    weights.

    Args:
        normalize: the input normalization, usually :class:`Normalize`.
        net: the classifier that consumes normalized inputs.
    """

    normalize: nn.Module
    net: nn.Module

    def __init__(self, normalize: nn.Module, net: nn.Module) -> None:
        super().__init__(OrderedDict(normalize=normalize, net=net))
