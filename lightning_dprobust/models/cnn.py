"""Small tanh networks from the DP literature that timm lacks.

Papernot et al. 2020, "Tempered Sigmoid Activations for Deep Learning with Differential Privacy"
(https://arxiv.org/abs/2007.14191), showed that bounded activations such as tanh train better than ReLU under
DP-SGD. Their two-convolution MNIST network is the model of DP-CERT (Wu et al. 2023, https://arxiv.org/abs/2306.08656)
and DP-Adv (Bu et al. 2021, https://arxiv.org/abs/2112.12497) on MNIST and Fashion-MNIST.
"""

from __future__ import annotations

import torch
from torch import nn

from lightning_dprobust.models.registry import register_model

#: Smallest image side for which Papernot's 8x8/stride-2 then 4x4/stride-2 geometry leaves a 1x1 map.
PAPERNOT_MIN_SIDE = 14


def _check_shape(input_shape: tuple[int, int, int], min_side: int, name: str) -> None:
    channels, height, width = input_shape
    if channels < 1 or min(height, width) < min_side:
        raise ValueError(
            f"{name} needs input_shape (C, H, W) with C >= 1 and H, W >= {min_side}, got {tuple(input_shape)}: "
            "resize the images or choose another model"
        )


def channels_last(x: torch.Tensor) -> torch.Tensor:
    """A 4-D CPU tensor with the same values stored channels-last (others are returned as they are).

    Made by permutes and a copy, which ``torch.func.vmap`` supports (``contiguous(memory_format=...)`` is not supported
    there), so the vmap engine runs the same model. Convolutions, ``tanh`` and max-pooling keep the layout.
    """
    if x.device.type != "cpu" or x.dim() != 4:
        return x
    return x.permute(0, 2, 3, 1).contiguous().permute(0, 3, 1, 2)


class CNNTanh(nn.Module):
    """Papernot et al. 2020's tempered-sigmoid CNN: two tanh convolutions, each max-pooled, then two linear layers.

    For images at least 14 pixels per side the layers are those of Papernot et al. (and of Opacus' MNIST
    ``SampleConvNet``, which uses ReLU)::

        conv1 = Conv2d(C, 16, kernel_size=8, stride=2, padding=3) -> tanh -> MaxPool2d(2, stride=1)
        conv2 = Conv2d(16, 32, kernel_size=4, stride=2)           -> tanh -> MaxPool2d(2, stride=1)
        flatten -> Linear(., 32) -> tanh -> Linear(32, num_classes)

    ``conv1`` uses ``padding=3`` as Papernot et al.'s code, Opacus' ``SampleConvNet`` and DP-Adv's ``MNISTConvNet``
    do. DP-CERT's code uses ``padding=2``; on 28x28 inputs both reach the same 32x4x4 map (512 features) and the
    same 26,010 parameters, but only ``padding=3`` reproduces the published layer shapes (16x13x13 after pool1).
    Smaller images (the embedded 8x8 digits) cannot take an 8x8/stride-2 kernel; there both convolutions become
    ``kernel_size=3, stride=1, padding=1``, keeping the same conv-tanh-pool, conv-tanh-pool, linear-tanh-linear
    structure. The flatten size is found by a dummy forward at construction, so any image size from 3 pixels per
    side up works (1x28x28 -> 26,010 parameters, 3x32x32 -> 37,274, 1x8x8 -> 42,026 with 10 classes).

    The network has no normalization layer and no cross-example operation, so it is DP-compatible as built.

    On CPU the maps after ``conv1`` are stored channels-last (:func:`channels_last`): the outputs and gradients are
    those of NCHW maps up to the float rounding of ``conv2``, and each pool's gradient goes to the same element, ties
    included (tested). PyTorch's CPU max-pool kernel is several times slower on contiguous NCHW maps of these sizes;
    with the layout change a non-private training step on 1x28x28 images takes about half the time (one thread,
    batch 64 / 256 / 1024: 4.6 / 22 / 86 ms against 8.4 / 35 / 162 ms).

    Args:
        num_classes: number of output logits.
        input_shape: ``(C, H, W)`` of the images.
        channels: output channels of ``conv1`` and ``conv2``.
        hidden: width of the hidden linear layer.

    Shape:
        - Input: ``(B, C, H, W)``.
        - Output: ``(B, num_classes)`` logits.

    Raises:
        ValueError: if a side of ``input_shape`` is smaller than 3.
    """

    def __init__(
        self,
        num_classes: int,
        input_shape: tuple[int, int, int],
        channels: tuple[int, int] = (16, 32),
        hidden: int = 32,
    ) -> None:
        super().__init__()
        _check_shape(input_shape, 3, "cnn_tanh")
        in_chans, height, width = input_shape
        if min(height, width) >= PAPERNOT_MIN_SIDE:
            geometry = [dict(kernel_size=8, stride=2, padding=3), dict(kernel_size=4, stride=2)]
        else:
            geometry = [dict(kernel_size=3, stride=1, padding=1)] * 2
        self.conv1 = nn.Conv2d(in_chans, channels[0], **geometry[0])
        self.pool1 = nn.MaxPool2d(2, stride=1)
        self.conv2 = nn.Conv2d(channels[0], channels[1], **geometry[1])
        self.pool2 = nn.MaxPool2d(2, stride=1)
        with torch.no_grad():
            flat = self._features(torch.zeros(1, *input_shape)).shape[1]
        self.fc1 = nn.Linear(flat, hidden)
        self.fc2 = nn.Linear(hidden, num_classes)

    def _features(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool1(torch.tanh(channels_last(self.conv1(x))))
        x = self.pool2(torch.tanh(self.conv2(x)))
        return x.flatten(1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Return the logits of a batch of normalized images."""
        return self.fc2(torch.tanh(self.fc1(self._features(x))))


class MLPTanh(nn.Module):
    """A two-hidden-layer tanh MLP on flattened images, the fully connected baseline of Papernot et al. 2020.

    Args:
        num_classes: number of output logits.
        input_shape: ``(C, H, W)`` of the images.
        hidden: width of both hidden layers.

    Shape:
        - Input: ``(B, C, H, W)``.
        - Output: ``(B, num_classes)`` logits.
    """

    def __init__(self, num_classes: int, input_shape: tuple[int, int, int], hidden: int = 128) -> None:
        super().__init__()
        _check_shape(input_shape, 1, "mlp_tanh")
        features = input_shape[0] * input_shape[1] * input_shape[2]
        self.layers = nn.Sequential(
            nn.Flatten(),
            nn.Linear(features, hidden),
            nn.Tanh(),
            nn.Linear(hidden, hidden),
            nn.Tanh(),
            nn.Linear(hidden, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Return the logits of a batch of normalized images."""
        return self.layers(x)


@register_model("cnn_tanh")
def cnn_tanh(*, num_classes: int, input_shape: tuple[int, int, int], **kwargs: object) -> CNNTanh:
    """Papernot et al. 2020's tanh CNN, sized by ``input_shape`` (see :class:`CNNTanh`)."""
    return CNNTanh(num_classes, input_shape, **kwargs)


@register_model("mlp_tanh")
def mlp_tanh(*, num_classes: int, input_shape: tuple[int, int, int], **kwargs: object) -> MLPTanh:
    """A two-hidden-layer tanh MLP (see :class:`MLPTanh`)."""
    return MLPTanh(num_classes, input_shape, **kwargs)


class AbadiCNN(nn.Module):
    """The CIFAR network of Abadi et al. 2016 (https://arxiv.org/abs/1607.00133, section 5.3), which DP-Adv (Bu et al.
    2021, https://arxiv.org/abs/2112.12497, section 4.4) pre-trains on CIFAR-100 before training privately on
    CIFAR-10: two 5x5 convolutions of 64 channels (stride 1, ReLU, 2x2 max-pool each), two fully connected layers of
    384 units (ReLU) and a linear head. Local response normalization and batch normalization are dropped (neither
    can be clipped per example). The head is :attr:`head`, so a pre-trained body can be kept and the head replaced.

    Args:
        num_classes: number of output logits.
        input_shape: ``(C, H, W)`` of the images (Abadi et al. crop CIFAR to 24x24; 32x32 works as well).
        channels: channels of both convolutions.
        hidden: width of both fully connected layers.
    """

    def __init__(
        self, num_classes: int, input_shape: tuple[int, int, int], channels: int = 64, hidden: int = 384
    ) -> None:
        super().__init__()
        _check_shape(input_shape, 4, "abadi_cnn")
        c, height, width = input_shape
        self.body = nn.Sequential(
            nn.Conv2d(c, channels, 5, padding=2),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(channels, channels, 5, padding=2),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Flatten(),
            nn.Linear(channels * (height // 4) * (width // 4), hidden),
            nn.ReLU(),
            nn.Linear(hidden, hidden),
            nn.ReLU(),
        )
        self.head = nn.Linear(hidden, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Return the logits of a batch of normalized images."""
        return self.head(self.body(x))


@register_model("abadi_cnn")
def abadi_cnn(*, num_classes: int, input_shape: tuple[int, int, int], **kwargs: object) -> AbadiCNN:
    """Abadi et al. 2016's CIFAR CNN (see :class:`AbadiCNN`)."""
    return AbadiCNN(num_classes, input_shape, **kwargs)
