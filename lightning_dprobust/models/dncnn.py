"""DnCNN-style denoiser with GroupNorm, the denoiser ``g`` of TransDenoiser.

Zhang, Zuo, Chen, Meng, Zhang 2017, "Beyond a Gaussian Denoiser: Residual Learning of Deep CNN for Image Denoising"
(https://arxiv.org/abs/1608.03981): a stack of 3x3 convolutions predicts the noise, which is subtracted from the
input (residual learning). BatchNorm is replaced by GroupNorm, which normalizes each example alone, so per-example
gradients stay per-example (DP-SGD) and the thesis's layer normalization (Tang 2021, App. .14) is matched.
"""

from __future__ import annotations

import torch
from torch import nn

from lightning_dprobust.models.registry import register_model


class DnCNN(nn.Module):
    """``g(z) = z - r(z)`` with ``r`` = conv -> ReLU -> ``depth - 2`` x (conv -> GroupNorm -> ReLU) -> conv.

    The three children ``first``, ``middle`` and ``last`` are the parameter slices ``theta_1``, ``theta_2`` and
    ``theta_3`` of TransDenoiser (thesis App. .13).

    Args:
        channels: image channels ``C``.
        width: feature maps of the hidden convolutions.
        depth: number of convolutions, >= 3.
        groups: GroupNorm groups; must divide ``width``.

    Shape:
        input ``[B, C, H, W]`` -> output ``[B, C, H, W]``.
    """

    def __init__(self, channels: int, width: int = 32, depth: int = 5, groups: int = 8) -> None:
        super().__init__()
        if depth < 3:
            raise ValueError(f"DnCNN depth must be >= 3 (first, middle, last convolutions), got {depth}")
        if width < 1 or groups < 1 or width % groups:
            raise ValueError(f"DnCNN groups={groups} must divide width={width} (both >= 1): e.g. width=32, groups=8")
        self.first = nn.Sequential(nn.Conv2d(channels, width, 3, padding=1), nn.ReLU())
        middle: list[nn.Module] = []
        for _ in range(depth - 2):
            middle += [nn.Conv2d(width, width, 3, padding=1, bias=False), nn.GroupNorm(groups, width), nn.ReLU()]
        self.middle = nn.Sequential(*middle)
        self.last = nn.Conv2d(width, channels, 3, padding=1)
        with torch.no_grad():  # start close to the identity map g(z) = z
            self.last.weight.mul_(0.1)
            self.last.bias.zero_()

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        """Return the denoised images."""
        return z - self.last(self.middle(self.first(z)))


@register_model("dncnn_gn")
def dncnn_gn(*, num_classes: int, input_shape: tuple[int, int, int], **kwargs: object) -> DnCNN:
    """DnCNN denoiser for ``input_shape`` images (``num_classes`` is ignored: a denoiser outputs images)."""
    return DnCNN(int(input_shape[0]), **kwargs)
