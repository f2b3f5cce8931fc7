"""DP-SGD: Abadi, Chu, Goodfellow, McMahan, Mironov, Talwar, Zhang, "Deep Learning with Differential Privacy",
CCS 2016 (arXiv 1607.00133)."""

from __future__ import annotations

from lightning_dprobust.methods.base import ClassifierModule


class DPSGD(ClassifierModule):
    """A classifier trained with DP-SGD when ``DPCallback`` is attached, and with plain SGD otherwise.

    The algorithm (Abadi et al. 2016, Algorithm 1) is split between this module and the callback: the module
    defines the per-example loss; ``DPCallback`` samples each batch with Poisson sampling, clips each example's
    gradient to ``max_grad_norm``, adds ``N(0, (noise_multiplier * max_grad_norm)^2)`` to the sum, divides by
    the expected batch size and accounts for the step. With ``optimizer="adam"`` the same noisy gradient feeds
    Adam (DP-Adam); post-processing costs no privacy.

    Example:
        >>> import torch
        >>> from lightning_dprobust.methods import DPSGD
        >>> module = DPSGD(model="cnn_tanh", num_classes=10, input_shape=(1, 8, 8), lr=0.5)
        >>> module(torch.rand(2, 1, 8, 8)).shape
        torch.Size([2, 10])
    """
