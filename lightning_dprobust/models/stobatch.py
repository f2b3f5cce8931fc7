"""The StoBatch network: a DP auto-encoder layer ``theta1`` with fixed Laplace noise, then the classifier ``theta2``.

Phan et al., ICML 2020 (https://arxiv.org/abs/1903.09822), Alg. 1 line 3: ``f`` has hidden layers
``{h_1 + 2 chi2 / m, ..., h_pi}`` and reads inputs ``x + chi1 / m``. The noise is drawn once and kept in buffers, so
checkpoints and released weights carry it: inference reuses the training draw (Appendix N).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lightning_dprobust.core import stobatch as sb
from lightning_dprobust.models.registry import register_model


class StoBatchNet(nn.Module):
    """``f(x) = W_pi tanh(body(tanh(theta1 * x_bar) + 2 chi2 / m))`` with ``x_bar = (2 x - 1) + chi1 / m``.

    ``theta1`` is a bias-free convolution (``encoder``) whose tanh output lies in ``[-1, 1]`` (Lemma 2 needs it); its
    tied transpose reconstructs the input (:meth:`reconstruct`). ``theta2`` starts with a batch normalization of each
    element of ``h_bar`` over the batch: post-processing of the perturbed hidden layer, it removes the constant offset
    that the fixed noise adds (a per-channel normalization would keep its spatial spread) and rescales the signal, as
    the authors' code normalizes the first layer. The last hidden layer is a tanh, so ``h_pi`` lies in
    ``[-1, 1]`` (Lemma 4), and the head ``W_pi`` has no bias (a bias would read the labels without noise).
    Images come in ``[0, 1]`` (DESIGN.md contract 1) and are mapped to the paper's ``[-1, 1]`` inside.

    Buffers: ``input_noise = chi1 / m`` (input shape), ``hidden_noise = 2 chi2 / m`` (the first-layer map) and
    ``label_noise = chi3`` (``[hidden, num_classes]``, the batch-sum scale), drawn once by :meth:`draw_noise`.

    Args:
        num_classes: ``K``.
        input_shape: ``(C, H, W)``.
        channels: feature maps of ``theta1``.
        kernel_size, stride, padding: geometry of ``theta1``; ``d = C k^2`` and ``beta`` = one map's size.
        body_channels: channels of the 3x3 convolution of ``theta2``.
        hidden: ``|h_pi|``.
        batch_size: ``m``, the size of every fixed batch.
        epsilon: the total budget ``epsilon1 (1 + 1/gamma_x + 1/gamma) + epsilon2`` (Theorem 4).
        budget_split: how ``epsilon`` is split into ``epsilon1`` and ``epsilon2`` (``mnist``, ``cifar10``,
            ``tiny_imagenet``: Appendix P, :func:`~lightning_dprobust.core.stobatch.split_budget`).
        theta1_bound: ``Delta_h``, the bound that the training keeps ``theta1``'s input norm below (it fixes
            ``gamma = 2 Delta_R / (m Delta_h)`` before training; the paper leaves it open, spec section 15 item 8).
        psi: shrink of the fresh inference noise (Appendix N).

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
        body_channels: int = 32,
        hidden: int = 64,
        batch_size: int = 100,
        epsilon: float = 2.0,
        budget_split: sb.BudgetSplit = "mnist",
        theta1_bound: float = 1.0,
        psi: float = 2.0,
    ) -> None:
        super().__init__()
        c, height, width = input_shape
        self.input_shape = tuple(input_shape)
        self.encoder = nn.Conv2d(c, channels, kernel_size, stride, padding, bias=False)
        self.map_shape = tuple(self.encoder(torch.zeros(1, *input_shape)).shape[1:])
        self.body = nn.Sequential(
            nn.Flatten(),
            nn.BatchNorm1d(math.prod(self.map_shape)),
            nn.Unflatten(1, self.map_shape),
            nn.Conv2d(channels, body_channels, 3, padding=1),
            nn.ReLU(),
            nn.Flatten(),
            nn.Linear(body_channels * self.map_shape[1] * self.map_shape[2], hidden),
            nn.Tanh(),
        )
        self.head = nn.Linear(hidden, num_classes, bias=False)
        self.batch_size, self.psi, self.theta1_bound = int(batch_size), float(psi), float(theta1_bound)
        self.delta_r = sb.reconstruction_sensitivity(c * kernel_size**2, self.map_shape[1] * self.map_shape[2])
        self.delta_l2 = sb.label_sensitivity(hidden)
        self.gamma_x = sb.gamma_x(self.delta_r, self.batch_size)
        self.gamma = sb.gamma_h(self.delta_r, self.batch_size, self.theta1_bound)
        self.epsilon1, self.epsilon2 = sb.split_budget(float(epsilon), budget_split, self.gamma, self.gamma_x)
        sb.project_theta1(self.encoder.weight, self.theta1_bound)
        self.register_buffer("input_noise", torch.zeros(input_shape))
        self.register_buffer("hidden_noise", torch.zeros(self.map_shape))
        self.register_buffer("label_noise", torch.zeros(hidden, num_classes))
        self.register_buffer("noise_drawn", torch.tensor(False))

    @property
    def input_scale(self) -> float:
        """Laplace scale of each input coordinate's noise, ``Delta_R / (m epsilon1)`` (Eq. 16)."""
        return self.delta_r / (self.batch_size * self.epsilon1)

    @property
    def hidden_scale(self) -> float:
        """Laplace scale of each first-layer neuron's noise, ``2 Delta_R / (m epsilon1)`` (Eq. 17)."""
        return 2 * self.input_scale

    @property
    def label_scale(self) -> float:
        """Laplace scale of each label coefficient's batch-sum noise, ``Delta_L2 / epsilon2`` (Lemma 4)."""
        return self.delta_l2 / self.epsilon2

    @torch.no_grad()
    def draw_noise(self, generator: torch.Generator) -> None:
        """Draw ``chi1``, ``chi2``, ``chi3`` from ``generator`` (Alg. 1 line 1); only ever once per network.

        Raises:
            RuntimeError: the noise was drawn already (a second draw would be a second, unaccounted release).
        """
        if bool(self.noise_drawn):
            raise RuntimeError("StoBatch noise is drawn once per model; this network already holds its draw")
        self.input_noise.copy_(sb.laplace(self.input_noise.shape, self.input_scale, generator))
        self.hidden_noise.copy_(sb.laplace(self.hidden_noise.shape, self.hidden_scale, generator))
        self.label_noise.copy_(sb.laplace(self.label_noise.shape, self.label_scale, generator))
        self.noise_drawn.fill_(True)

    def perturb(self, x: Tensor) -> Tensor:
        """``x_bar = (2 x - 1) + chi1 / m``: the perturbed input in the paper's scale."""
        return 2 * x - 1 + self.input_noise

    def hidden(self, x_bar: Tensor, extra_noise: Tensor | None = None) -> Tensor:
        """``h_bar = tanh(theta1 * x_bar) + 2 chi2 / m`` (+ ``extra_noise``, the fresh inference draws)."""
        h = torch.tanh(self.encoder(x_bar)) + self.hidden_noise
        return h if extra_noise is None else h + extra_noise

    def classify(self, h_bar: Tensor) -> Tensor:
        """``theta2``: logits from the perturbed first hidden layer."""
        return self.head(self.body(h_bar))

    def last_hidden(self, h_bar: Tensor) -> Tensor:
        """``h_pi`` in ``[-1, 1]``."""
        return self.body(h_bar)

    def reconstruct(self, h_bar: Tensor) -> Tensor:
        """Tied-weight reconstruction ``x_tilde = theta1 h_bar`` (transposed convolution with the encoder's weight)."""
        conv = self.encoder
        out = F.conv_transpose2d(h_bar, conv.weight, stride=conv.stride, padding=conv.padding)
        height, width = self.input_shape[1:]
        return F.pad(out, (0, width - out.shape[-1], 0, height - out.shape[-2]))

    def forward(self, x: Tensor) -> Tensor:
        """Logits with the training draw of the noise (the ``n -> infinity`` limit of Appendix N's estimate)."""
        return self.classify(self.hidden(self.perturb(x)))

    pixeldp_attack_norm = "linf"

    @torch.no_grad()
    def pixeldp_scores(self, x: Tensor, n: int, generator: torch.Generator) -> Tensor:
        """``[n, B, K]`` composed scores ``p_x * p_h`` (Eq. 11, Corollary 1, Appendix N) for ``x`` in ``[0, 1]``.

        Draw ``t``: ``p_x`` = softmax with fresh input noise ``Lap(Delta_R / (m epsilon1 psi))`` on top of the training
        draw and the hidden noise held at its training draw; ``p_h`` = softmax with fresh hidden noise
        ``Lap(2 Delta_R / (m epsilon1 psi))`` and the input noise held. Fresh noise comes from ``generator`` only and
        never touches the buffers.
        """
        if not isinstance(n, int) or n < 1:
            raise ValueError(f"n={n!r} must be an int >= 1 (the Monte-Carlo draws)")
        x_bar = self.perturb(x)
        h_fixed = self.hidden(x_bar)
        scores = []
        for _ in range(n):
            fresh_x = sb.laplace(tuple(x.shape), self.input_scale / self.psi, generator).to(x)
            fresh_h = sb.laplace(tuple(h_fixed.shape), self.hidden_scale / self.psi, generator).to(x)
            p_x = self.classify(self.hidden(x_bar + fresh_x)).softmax(-1)
            p_h = self.classify(h_fixed + fresh_h).softmax(-1)
            scores.append(p_x * p_h)
        return torch.stack(scores)

    def pixeldp_radius_scale(self) -> float:
        """Certified l_inf radius in ``[0, 1]`` pixel units per unit of ``epsilon_r*`` (Eq. 13).

        ``Delta_R / (m epsilon1 (Delta_r^x + Delta_r^h / 2)) / 2`` with sound sensitivities for the unit l_inf ball
        of the paper's ``[-1, 1]`` scale: ``Delta_r^x`` = the number of input coordinates, ``Delta_r^h = beta sum_f
        ||w_f||_1`` (spec section 15 item 6); the final ``/ 2`` converts ``[-1, 1]`` units to pixel units. It does not
        divide by ``psi`` (the paper does not); a strict certificate also divides by :attr:`psi`.
        """
        delta_rx = math.prod(self.input_shape)
        beta = self.map_shape[1] * self.map_shape[2]
        delta_rh = beta * float(self.encoder.weight.detach().abs().sum())
        return sb.radius_factor(self.delta_r, self.batch_size, self.epsilon1, delta_rx, delta_rh) / 2


@register_model("stobatch_cnn")
def stobatch_cnn(*, num_classes: int, input_shape: tuple[int, int, int], **kwargs) -> StoBatchNet:
    """:class:`StoBatchNet` (its privacy constants ``batch_size``, ``epsilon``, ``budget_split`` are arguments)."""
    return StoBatchNet(num_classes=num_classes, input_shape=input_shape, **kwargs)
