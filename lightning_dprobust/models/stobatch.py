"""The StoBatch network: an auto-encoder layer ``theta1`` with fixed Laplace noise, then the classifier ``theta2``.

Phan et al., ICML 2020 (https://arxiv.org/abs/1903.09822), Alg. 1 line 3: ``f`` has hidden layers
``{h_1 + 2 chi2 / m, ..., h_pi}`` and reads perturbed inputs ``x + chi1 / m``. The hidden and label noise are drawn
once and kept in non-persistent buffers; the input noise is one draw per fixed batch, held by the StoBatch method and
passed to :meth:`StoBatchNet.perturb`. All of it is secret training state, never in the network's ``state_dict`` (so
never in released weights); the StoBatch method keeps it in its private training checkpoints. The privacy arithmetic
(scales, budget, drawing) lives in :mod:`lightning_dprobust.core.stobatch` and the StoBatch method; its epsilon is
nominal, not a differential-privacy guarantee (see the method).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lightning_dprobust.models.registry import register_model

InferenceNoise = Literal["released", "training_draw"]
Normalization = Literal["none", "batch"]
NORMALIZATIONS: tuple[str, ...] = ("none", "batch")


class StoBatchNet(nn.Module):
    """``f(x) = W_pi tanh(body(features(x_bar)))`` with ``x_bar = (2 x - 1) + chi1_b / m`` (``b``: the example's batch).

    ``theta1`` is a bias-free convolution (``encoder``) whose tanh output ``h = tanh(theta1 * x_bar)`` lies in
    ``[-1, 1]`` (Lemma 2 needs it); its tied transpose reconstructs the input from the perturbed hidden layer
    ``h_bar = h + 2 chi2 / m`` (:meth:`hidden`, :meth:`reconstruct`), the functional mechanism of ``theta1``. The last
    hidden layer is a tanh, so ``h_pi`` lies in ``[-1, 1]`` (Lemma 4), and the head ``W_pi`` has no bias (a bias would
    read the labels without noise). Images come in ``[0, 1]`` (docs/design.md, contract 1) and are mapped to the paper's
    ``[-1, 1]`` inside.

    What ``theta2`` reads (``normalization``):

    - ``"none"`` (default): ``feature_gain * h`` of each example alone, with no statistic over other examples, so
      ``h_pi`` of an example depends on that example and the parameters only, as Lemma 4's sensitivity
      ``Delta_L2 = 2 |h_pi|`` assumes. ``h`` is computed from the perturbed input ``x_bar`` (Lemma 3's
      ``epsilon1 / gamma_x`` release, nominal); the hidden offset ``2 chi2 / m`` (Laplace scale about 4
      on digits, against a spread of ``h`` across examples of about 0.01) would saturate the unnormalized layers, and
      a constant cannot be removed from one example without reading the others. The hidden noise stays in the
      reconstruction objective of ``theta1`` (Eq. 17). ``feature_gain`` (a public constant) brings that spread to the
      order of one.
    - ``"batch"``: the paper's form, ``h_bar`` normalized element-wise over the batch (``BatchNorm1d``), as the
      authors' code normalizes the first layer. In training one example then moves every other example's ``h_pi``,
      so Lemma 4's bound does not hold either.

    Buffers: ``hidden_noise = 2 chi2 / m`` (the first-layer map) and ``label_noise = chi3`` (``[hidden,
    num_classes]``, the batch-sum scale), set once by :meth:`set_noise`. They are non-persistent: ``state_dict()`` (a
    release) never holds them, because whoever knows the draw can strip it from the perturbed objective. The input
    noise ``chi1_b / m`` is not a buffer: each fixed batch ``b`` has its own draw, passed to :meth:`perturb` as
    ``offset``.

    Inference noise (``inference_noise``): in training mode the hidden draw always applies (it is the training
    objective). In eval mode, ``"released"`` (default) uses a zero offset in place of the draw, so predictions depend
    on the released weights only; fresh noise is added by the caller (PixelDP scores). The network was trained on
    inputs shifted by its batches' ``chi1_b / m``, a distribution shift that costs accuracy in ``"released"`` mode.
    Under ``"batch"`` the hidden shift ``-2 chi2 / m`` is removed by normalizing over the batch being classified
    (:meth:`classify`). ``"training_draw"`` reuses the hidden draw as the paper's inference does (Appendix N); the
    input draws differ from batch to batch, so no single input offset is reused (it reads no input offset). Only
    sound while the draw stays secret (a private checkpoint, never a release).

    Args:
        num_classes: ``K``.
        input_shape: ``(C, H, W)``.
        channels: feature maps of ``theta1``.
        kernel_size, stride, padding: geometry of ``theta1``; ``d = C k^2`` and ``beta`` = one map's size.
        body_channels: channels of the convolution of ``theta2``; a list gives one convolution (ReLU) per entry, the
            paper's bodies (Appendix P): ``[64]`` with ``body_kernel_size=5, body_stride=2`` on MNIST (conv1 32 and
            conv2 64 maps of 5x5 patches), ``[128, 256]`` with ``body_kernel_size=5`` on CIFAR-10 (conv1 128 of 4x4,
            then 128 and 256 of 5x5).
        body_kernel_size, body_stride: geometry of the body's convolutions (padding ``body_kernel_size // 2``).
        body_pool: average-pooling window after the body's convolutions (1: none; the authors' CIFAR-10 code: 2).
        hidden: ``|h_pi|``.
        inference_noise: ``"released"`` or ``"training_draw"`` (above).
        normalization: ``"none"`` or ``"batch"`` (above).
        feature_gain: scale of ``h`` read by ``theta2`` under ``"none"`` (a public constant; unused under ``"batch"``).

    Shape:
        Input ``[B, C, H, W]`` in ``[0, 1]``; output ``[B, num_classes]`` logits.
    """

    def __init__(
        self,
        *,
        num_classes: int,
        input_shape: tuple[int, int, int],
        channels: int = 16,
        kernel_size: int = 4,
        stride: int = 2,
        padding: int = 1,
        body_channels: int | Sequence[int] = 32,
        hidden: int = 64,
        body_kernel_size: int = 3,
        body_stride: int = 1,
        body_pool: int = 1,
        inference_noise: InferenceNoise = "released",
        normalization: Normalization = "none",
        feature_gain: float = 30.0,
    ) -> None:
        super().__init__()
        if inference_noise not in ("released", "training_draw"):
            raise ValueError(f"inference_noise={inference_noise!r} must be 'released' or 'training_draw'")
        if normalization not in NORMALIZATIONS:
            raise ValueError(
                f"normalization={normalization!r} must be 'none' (per example) or 'batch' (the paper's batch "
                "normalization, which also couples the examples)"
            )
        if not (isinstance(feature_gain, int | float) and feature_gain > 0):
            raise ValueError(f"feature_gain={feature_gain!r} must be a number > 0 (the scale of h read by theta2)")
        self.inference_noise, self.normalization = inference_noise, normalization
        self.feature_gain = float(feature_gain)
        c, height, width = input_shape
        self.input_shape = tuple(input_shape)
        self.encoder = nn.Conv2d(c, channels, kernel_size, stride, padding, bias=False)
        self.map_shape = tuple(self.encoder(torch.zeros(1, *input_shape)).shape[1:])
        normalize = (
            [nn.Flatten(), nn.BatchNorm1d(math.prod(self.map_shape)), nn.Unflatten(1, self.map_shape)]
            if normalization == "batch"
            else []
        )
        widths = [body_channels] if isinstance(body_channels, int) else [int(c) for c in body_channels]
        if not widths or min(widths) < 1:
            raise ValueError(f"body_channels={body_channels!r} must be a positive int or a non-empty list of them")
        convolutions: list[nn.Module] = []
        for width_in, width_out in zip([channels, *widths[:-1]], widths, strict=True):
            conv = nn.Conv2d(width_in, width_out, body_kernel_size, body_stride, padding=body_kernel_size // 2)
            convolutions += [conv, nn.ReLU()]
        if body_pool > 1:
            convolutions.append(nn.AvgPool2d(body_pool))
        conv_shape = nn.Sequential(*convolutions)(torch.zeros(1, *self.map_shape)).shape[1:]
        self.body = nn.Sequential(
            *normalize,
            *convolutions,
            nn.Flatten(),
            nn.Linear(math.prod(conv_shape), hidden),
            nn.Tanh(),
        )
        self.head = nn.Linear(hidden, num_classes, bias=False)
        self.patch_size = c * kernel_size**2
        self.neurons = self.map_shape[1] * self.map_shape[2]
        self.register_buffer("hidden_noise", torch.zeros(self.map_shape), persistent=False)
        self.register_buffer("label_noise", torch.zeros(hidden, num_classes), persistent=False)
        self.register_buffer("noise_drawn", torch.tensor(False), persistent=False)

    @torch.no_grad()
    def set_noise(self, hidden_noise: Tensor, label_noise: Tensor) -> None:
        """Store the one draw of the hidden and label noise (Alg. 1 line 1), already scaled: ``2 chi2 / m``, ``chi3``.

        Raises:
            RuntimeError: the noise was set already (a second draw would be a second, unaccounted release).
        """
        if bool(self.noise_drawn):
            raise RuntimeError("StoBatch noise is drawn once per model; this network already holds its draw")
        self.hidden_noise.copy_(hidden_noise)
        self.label_noise.copy_(label_noise)
        self.noise_drawn.fill_(True)

    @property
    def uses_draw(self) -> bool:
        """Whether the hidden draw is added: in training mode (zero before :meth:`set_noise`), in eval mode only for
        ``"training_draw"``, which needs a network holding its draw (:meth:`check_draw`)."""
        self.check_draw()
        return self.training or self.inference_noise == "training_draw"

    def check_draw(self) -> None:
        """Raise ``RuntimeError`` in eval mode under ``"training_draw"`` when the network holds no draw."""
        if not self.training and self.inference_noise == "training_draw" and not bool(self.noise_drawn):
            raise RuntimeError(
                "inference_noise='training_draw' needs the training draw, and this StoBatch network holds none "
                "(released weights never do): load a private training checkpoint or use inference_noise='released'"
            )

    def perturb(self, x: Tensor, offset: Tensor | None = None) -> Tensor:
        """``x_bar = (2 x - 1) + offset`` in the paper's scale; ``offset`` is each example's ``chi1_b / m`` in
        training (broadcast against ``x``) and ``None`` (zero) otherwise."""
        return 2 * x - 1 if offset is None else 2 * x - 1 + offset

    def hidden(self, x_bar: Tensor, extra_noise: Tensor | None = None) -> Tensor:
        """``h_bar = tanh(theta1 * x_bar) + 2 chi2 / m`` (offset 0 when :attr:`uses_draw` is false), plus
        ``extra_noise`` (the fresh inference draws)."""
        h = torch.tanh(self.encoder(x_bar))
        h = h + self.hidden_noise if self.uses_draw else h
        return h if extra_noise is None else h + extra_noise

    def features(self, x_bar: Tensor, extra_noise: Tensor | None = None) -> Tensor:
        """What ``theta2`` reads: ``h = tanh(theta1 * x_bar)`` under ``"none"``, ``h_bar`` (:meth:`hidden`) under
        ``"batch"``; plus ``extra_noise`` (the fresh inference draws)."""
        if self.normalization == "batch":
            return self.hidden(x_bar, extra_noise)
        h = torch.tanh(self.encoder(x_bar))
        return h if extra_noise is None else h + extra_noise

    def classify(self, h: Tensor) -> Tensor:
        """``theta2``: logits from :meth:`features`.

        Under ``"none"`` each example's logits depend on that example alone, in every mode and for any batch size.
        Under ``"batch"`` without the draw (``"released"`` in eval mode) the first normalization uses the statistics of
        the batch being classified instead of the running ones: the running mean holds the training offset
        ``2 chi2 / m``, which the batch mean removes exactly as in training. The running statistics are left
        untouched. Predictions then depend on the batch (at least 2 examples).
        """
        if self.normalization == "none":
            return self.head(self.body(self.feature_gain * h))
        if self.uses_draw:
            return self.head(self.body(h))
        if len(h) < 2:
            raise ValueError(
                f"a released StoBatch network classifies batches of at least 2 examples (its first normalization reads "
                f"the batch's statistics), got {len(h)}; batch the inputs"
            )
        norm = self.body[1]
        flat = F.batch_norm(self.body[0](h), None, None, norm.weight, norm.bias, training=True, eps=norm.eps)
        return self.head(self.body[2:](flat))

    def last_hidden(self, h: Tensor) -> Tensor:
        """``h_pi`` in ``[-1, 1]`` from :meth:`features` (training mode)."""
        return self.body(self.feature_gain * h if self.normalization == "none" else h)

    def reconstruct(self, h_bar: Tensor) -> Tensor:
        """Tied-weight reconstruction ``x_tilde = theta1 h_bar`` (transposed convolution with the encoder's weight)."""
        conv = self.encoder
        out = F.conv_transpose2d(h_bar, conv.weight, stride=conv.stride, padding=conv.padding)
        height, width = self.input_shape[1:]
        return F.pad(out, (0, width - out.shape[-1], 0, height - out.shape[-2]))

    def forward(self, x: Tensor) -> Tensor:
        """Logits without fresh noise and without an input offset: with the hidden training draw
        (``"training_draw"``, the ``n -> infinity`` limit of Appendix N's estimate) or a zero offset
        (``"released"``)."""
        self.check_draw()
        return self.classify(self.features(self.perturb(x)))


@register_model("stobatch_cnn")
def stobatch_cnn(*, num_classes: int, input_shape: tuple[int, int, int], **kwargs) -> StoBatchNet:
    """:class:`StoBatchNet`."""
    return StoBatchNet(num_classes=num_classes, input_shape=input_shape, **kwargs)
