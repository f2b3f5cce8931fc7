"""AIN's generator: a conditional self-attention encoder-decoder that outputs a bounded perturbation.

Tang, "Deep Learning with Differential Privacy and Adversarial Robustness", PhD thesis, Emory University 2021,
section 5.2.2 (AIN, TDSC 2021); layer sizes follow the authors' MNIST script (filters 4-3-4-3, strides 2-1-2-1, a
residual block after each convolution, SAGAN self-attention at encoder position 1 and decoder position -2, a
3-channel central state with ``N(0, 0.1^2)`` noise). Channel widths are arguments so that digits models stay small.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lightning_dprobust.models.registry import register_model

_KERNELS, _STRIDES = (4, 3, 4, 3), (2, 1, 2, 1)


class ConditionalStateExtractor(nn.Module):
    """One-hot label ``y`` to a state ``h_c`` of the image's height x width, and back to class logits.

    ``h_c = LayerNorm(sigmoid(W y + b))`` (no affine part: each example's state has mean 0 and variance 1 over its
    ``h * w`` entries); the reconstruction ``y_hat = W' h_c + b'`` is trained with cross-entropy against ``y``.

    Shape:
        labels ``[B]`` (class indices) -> state ``[B, 1, h, w]``, reconstruction logits ``[B, num_classes]``.
    """

    def __init__(self, num_classes: int, height: int, width: int) -> None:
        super().__init__()
        self.num_classes, self.shape = num_classes, (height, width)
        self.encode = nn.Linear(num_classes, height * width)
        self.norm = nn.LayerNorm(height * width, elementwise_affine=False)
        self.decode = nn.Linear(height * width, num_classes)

    def forward(self, labels: Tensor) -> tuple[Tensor, Tensor]:
        onehot = F.one_hot(labels.long(), self.num_classes).to(self.encode.weight.dtype)
        state = self.norm(torch.sigmoid(self.encode(onehot)))
        return state.view(-1, 1, *self.shape), self.decode(state)


class SelfAttention(nn.Module):
    """SAGAN self-attention (Zhang et al. 2019, https://arxiv.org/abs/1805.08318): ``x + gamma * attention(x)``,
    ``gamma`` starting at 0. Positions attend within one example only."""

    def __init__(self, channels: int, key_channels: int = 32) -> None:
        super().__init__()
        self.f = nn.Conv2d(channels, key_channels, 1)
        self.g = nn.Conv2d(channels, key_channels, 1)
        self.h = nn.Conv2d(channels, channels, 1)
        self.gamma = nn.Parameter(torch.zeros(1))

    def forward(self, x: Tensor) -> Tensor:
        query, key, value = self.f(x).flatten(2), self.g(x).flatten(2), self.h(x).flatten(2)
        weights = torch.softmax(query.transpose(1, 2) @ key, dim=-1)  # [B, N, N]
        return x + self.gamma * (value @ weights.transpose(1, 2)).view_as(x)


class ResidualBlock(nn.Module):
    """Shape-preserving ``x + conv1x1(act(norm(conv1x1(x))))`` with per-example (layer) normalization."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(channels, channels, 1),
            nn.GroupNorm(1, channels),
            nn.LeakyReLU(0.2),
            nn.Conv2d(channels, channels, 1),
        )

    def forward(self, x: Tensor) -> Tensor:
        return x + self.body(x)


def _stage(conv: nn.Module, channels: int) -> nn.Sequential:
    return nn.Sequential(conv, nn.GroupNorm(1, channels), nn.LeakyReLU(0.2), ResidualBlock(channels))


class AINGenerator(nn.Module):
    """``G(x, y) = clip(x + clip(z, -B, B), 0, 1)`` with ``z`` the decoder's output for ``[x, h_c(y)]``.

    Guarantees: ``||G(x, y) - x||_inf <= B`` and ``G(x, y)`` in ``[0, 1]``, for any input and any ``B >= 0``. Noise
    ``N(0, noise_std^2)`` is added to the central state in training **and** evaluation mode (``noise_std = 0`` is
    AIN_nr); it is drawn from the ``generator`` passed to :meth:`forward` (else the global RNG), one draw per example
    and entry, so example ``i``'s output depends on ``x[i]``, ``y[i]`` and its own draw alone. Every layer normalizes
    within one example (no BatchNorm).

    The buffers ``bound`` (the bound training reached; ``inf`` before training) and ``target_class`` (``-1``:
    untargeted) travel with the weights, so a saved generator says how it may be used.

    Args:
        num_classes: classes of the conditioning label. input_shape: ``(C, H, W)``; ``H`` and ``W`` divisible by 4.
        channels: widths of the four encoder convolutions (the decoder mirrors them).
        state_channels: channels of the central state. noise_std: std of the injected noise.
        attention_channels: key channels of the self-attention blocks (0: no self-attention).
    """

    def __init__(
        self,
        num_classes: int,
        input_shape: Sequence[int],
        channels: Sequence[int] = (16, 32, 32, 64),
        state_channels: int = 3,
        noise_std: float = 0.1,
        attention_channels: int = 32,
    ) -> None:
        super().__init__()
        c, h, w = (int(s) for s in input_shape)
        if h % 4 or w % 4 or len(channels) != 4 or noise_std < 0:
            raise ValueError(
                f"AINGenerator needs H and W divisible by 4, four channel widths and noise_std >= 0, got "
                f"input_shape={tuple(input_shape)}, channels={tuple(channels)}, noise_std={noise_std}"
            )
        self.noise_std = float(noise_std)
        self.input_shape, self.num_classes = (c, h, w), int(num_classes)  # the images and labels it was built for
        self.extractor = ConditionalStateExtractor(num_classes, h, w)
        widths = (c + 1, *channels)
        self.encoder = nn.Sequential(
            *[
                _stage(nn.Conv2d(widths[i], widths[i + 1], k, s, 1), widths[i + 1])
                for i, (k, s) in enumerate(zip(_KERNELS, _STRIDES, strict=True))
            ]
        )
        self.encoder.insert(1, SelfAttention(channels[0], attention_channels) if attention_channels else nn.Identity())
        self.to_state = nn.Conv2d(channels[-1], state_channels, 1)
        back = (*channels[::-1], channels[0])
        decoder = [nn.Conv2d(state_channels, channels[-1], 1)]
        for i, (k, s) in enumerate(zip(_KERNELS[::-1], _STRIDES[::-1], strict=True)):
            decoder.append(_stage(nn.ConvTranspose2d(back[i], back[i + 1], k, s, 1), back[i + 1]))
        decoder.insert(-1, SelfAttention(back[-2], attention_channels) if attention_channels else nn.Identity())
        self.decoder = nn.Sequential(*decoder, nn.Conv2d(channels[0], c, 3, 1, 1))
        self.register_buffer("bound", torch.tensor(float("inf")))
        self.register_buffer("target_class", torch.tensor(-1))

    def perturbation(self, x: Tensor, labels: Tensor, generator: torch.Generator | None = None) -> Tensor:
        """The unbounded last-layer output ``z`` for images ``x`` ``[B, C, H, W]`` and labels ``[B]``."""
        state, _ = self.extractor(labels)
        central = self.to_state(self.encoder(torch.cat([x, state.to(x.dtype)], dim=1)))
        if self.noise_std > 0:
            device = generator.device if generator is not None else central.device
            noise = torch.randn(central.shape, generator=generator, device=device, dtype=central.dtype)
            central = central + self.noise_std * noise.to(central.device)
        return self.decoder(central)

    def forward(
        self, x: Tensor, labels: Tensor, bound: float | Tensor | None = None, generator: torch.Generator | None = None
    ) -> Tensor:
        """``clip(x + clip(z, -B, B), 0, 1)``; ``bound`` defaults to the buffer ``bound``."""
        bound = self.bound if bound is None else torch.as_tensor(bound, dtype=x.dtype, device=x.device)
        z = self.perturbation(x, labels, generator)
        p = torch.maximum(torch.minimum(z, bound), -bound)
        return (x + p).clamp(0.0, 1.0)


@register_model("ain_generator")
def ain_generator(*, num_classes: int, input_shape: Sequence[int], **kwargs) -> AINGenerator:
    """AIN's generator (Tang 2021, thesis chapter 5); see :class:`AINGenerator` for the arguments."""
    return AINGenerator(num_classes, input_shape, **kwargs)


__all__ = ["AINGenerator", "ConditionalStateExtractor", "ResidualBlock", "SelfAttention", "ain_generator"]
