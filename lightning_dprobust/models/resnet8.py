"""Pre-activation ResNet8, the network of residual perturbation (Tao et al., ICLR 2021 submission, OpenReview
eNSpdJeR_J): the CIFAR ResNet of He et al. 2016 (https://arxiv.org/abs/1512.03385) with ``6n + 2`` layers and
``n = 1``, in the pre-activation form of He et al. 2016b (https://arxiv.org/abs/1603.05027) used by the authors'
EnResNet code (Wang, Shi, Osher 2019).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lightning_dprobust.models.dp_compat import make_dp_compatible
from lightning_dprobust.models.registry import register_model

STAGE_WIDTHS = (16, 32, 64)


class PreActBlock(nn.Module):
    """``out = conv2(relu(bn2(conv1(relu(bn1(x)))))) + shortcut(x)``; the shortcut projects ``relu(bn1(x))`` with
    a 1x1 convolution when the shape changes.

    The shortcut's output always passes through :attr:`skip_path` (an identity), so a residual-noise wrapper can
    read the block's ``x_s`` (its input after the projection) without re-running any layer.

    Args:
        in_planes: input channels.
        planes: output channels.
        stride: stride of ``conv1`` (and of the projection).
        skip: ``False`` removes the skip connection (and the projection): ``out = F(x)``, the paper's ablation.
    """

    def __init__(self, in_planes: int, planes: int, stride: int = 1, skip: bool = True) -> None:
        super().__init__()
        self.skip = skip
        self.bn1 = nn.BatchNorm2d(in_planes)
        self.conv1 = nn.Conv2d(in_planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=1, padding=1, bias=False)
        projects = skip and (stride != 1 or in_planes != planes)
        self.shortcut = nn.Conv2d(in_planes, planes, 1, stride=stride, bias=False) if projects else None
        self.skip_path = nn.Identity()

    def forward(self, x: Tensor) -> Tensor:
        """Return the block output (the residual mapping plus the skip connection when ``skip``)."""
        pre = F.relu(self.bn1(x))
        out = self.conv2(F.relu(self.bn2(self.conv1(pre))))
        if not self.skip:
            return out
        return out + self.skip_path(self.shortcut(pre) if self.shortcut is not None else x)


class PreActResNet8(nn.Module):
    """``conv3x3(C -> 16)``, one :class:`PreActBlock` per stage (16, 32/2, 64/2), BN-ReLU, global average pool, FC.

    Global pooling is adaptive, so any input of at least one pixel per side works: 32x32 (CIFAR), 50x50 (IDC;
    50 -> 25 -> 13) and the embedded 8x8 digits (8 -> 4 -> 2). 77,850 parameters for 3 input channels and 10
    classes. Initialization as EnResNet: He-normal convolutions (std ``sqrt(2 / (k^2 out_channels))``), BatchNorm
    weight 1 and bias 0.

    Args:
        num_classes: number of logits.
        input_shape: ``(C, H, W)`` of the images.
        skip: keep the skip connections (``False``: the paper's ablation of section 4.4).
    """

    def __init__(self, num_classes: int, input_shape: tuple[int, int, int], skip: bool = True) -> None:
        super().__init__()
        self.conv = nn.Conv2d(input_shape[0], STAGE_WIDTHS[0], 3, padding=1, bias=False)
        widths = (STAGE_WIDTHS[0], *STAGE_WIDTHS)
        self.blocks = nn.Sequential(
            *(PreActBlock(widths[i], widths[i + 1], 1 if i == 0 else 2, skip) for i in range(len(STAGE_WIDTHS)))
        )
        self.bn = nn.BatchNorm2d(STAGE_WIDTHS[-1])
        self.fc = nn.Linear(STAGE_WIDTHS[-1], num_classes)
        for module in self.modules():
            if isinstance(module, nn.Conv2d):
                fan_out = module.kernel_size[0] * module.kernel_size[1] * module.out_channels
                nn.init.normal_(module.weight, 0.0, math.sqrt(2.0 / fan_out))
            elif isinstance(module, nn.BatchNorm2d):
                nn.init.ones_(module.weight)
                nn.init.zeros_(module.bias)

    def forward(self, x: Tensor) -> Tensor:
        """Return the logits of a batch of normalized images."""
        out = F.relu(self.bn(self.blocks(self.conv(x))))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(out, 1), 1))


@register_model("preact_resnet8")
def preact_resnet8(
    *, num_classes: int, input_shape: tuple[int, int, int], skip: bool = True, dp_compatible: bool = False
) -> nn.Module:
    """Tao et al.'s pre-activation ResNet8 (see :class:`PreActResNet8`); ``dp_compatible=True`` swaps BatchNorm for
    GroupNorm (:func:`make_dp_compatible`), the DP-SGD baseline's network."""
    if input_shape[0] < 1 or min(input_shape[1:]) < 1:
        raise ValueError(f"preact_resnet8 needs input_shape (C, H, W) with positive entries, got {input_shape}")
    net = PreActResNet8(num_classes, input_shape, skip)
    return make_dp_compatible(net) if dp_compatible else net
