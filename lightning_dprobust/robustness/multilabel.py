"""FGSM on the multi-label binary cross-entropy (CelebA attributes), which torchattacks' CE-only attacks lack."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torchattacks.attack import Attack


class MultilabelFGSM(Attack):
    """Fast gradient sign method (Goodfellow et al. 2015, https://arxiv.org/abs/1412.6572) on the mean BCE loss.

    ``x' = clip_[0,1](x + eps * sign(grad_x BCE(f(x), y)))`` with ``y`` a ``{0, 1}`` label vector: the attack of
    DP-Adv's CelebA experiment (Bu et al. 2021, Section 4.6). Guarantees: ``||x' - x||_inf <= eps`` and ``x'`` in
    ``[0, 1]``; example ``i``'s output depends only on example ``i``.
    """

    def __init__(self, model: nn.Module, eps: float = 0.1) -> None:
        super().__init__("MultilabelFGSM", model)
        if not eps >= 0:
            raise ValueError(f"eps must be >= 0, got {eps}")
        self.eps = float(eps)
        self.supported_mode = ["default"]

    def forward(self, images: Tensor, labels: Tensor) -> Tensor:
        x = images.clone().detach().to(self.device).requires_grad_(True)
        loss = F.binary_cross_entropy_with_logits(self.get_logits(x), labels.float().to(self.device), reduction="sum")
        (gradient,) = torch.autograd.grad(loss, x)
        return (x + self.eps * gradient.sign()).clamp(0.0, 1.0).detach()
