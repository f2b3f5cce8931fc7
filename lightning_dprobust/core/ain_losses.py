"""AIN's losses, Eqs 5.1-5.6 of Tang, "Deep Learning with Differential Privacy and Adversarial Robustness", PhD
thesis, Emory University 2021, section 5.2.1. Every function returns one value per example: entry ``i`` uses only
example ``i``'s tensors, so no loss mixes two examples."""

from __future__ import annotations

import torch
from torch import Tensor


def distance_loss(perturbation: Tensor) -> Tensor:
    """``L_d = ||p||_2`` (Eq 5.2) per example. Shape: ``[B, ...]`` -> ``[B]``."""
    return perturbation.flatten(1).norm(dim=1)


def imitation_loss(
    adversarial: Tensor,
    imitated: Tensor,
    logits: Tensor,
    imitated_logits: Tensor,
    image_weight: float = 1.0,
    logit_weight: float = 1.0,
) -> Tensor:
    """``L_m = b_m1 ||x' - x_adv||_2 + b_m2 ||F(x') - F(x_adv)||_2`` (Eq 5.4) per example, ``F`` the logits."""
    images = (adversarial - imitated).flatten(1).norm(dim=1)
    return image_weight * images + logit_weight * (logits - imitated_logits).norm(dim=1)


def _best_other(logits: Tensor, excluded: Tensor) -> Tensor:
    """``max_{i != excluded} F_i`` per example."""
    mask = torch.zeros_like(logits, dtype=torch.bool).scatter_(1, excluded.view(-1, 1), True)
    return logits.masked_fill(mask, float("-inf")).amax(dim=1)


def targeted_margin(logits: Tensor, target: int | Tensor) -> Tensor:
    """``L_c = F_s - F_t`` with ``s = argmax_{i != t} F_i`` (Eq 5.5): negative once the target class wins."""
    target = torch.as_tensor(target, device=logits.device).expand(logits.shape[0]).long()
    return _best_other(logits, target) - logits.gather(1, target.view(-1, 1)).squeeze(1)


def untargeted_margin(logits: Tensor, labels: Tensor) -> Tensor:
    """``L_c = F_y - F_s`` with ``s = argmax_{i != y} F_i`` (Eq 5.6): negative once some other class wins."""
    return logits.gather(1, labels.view(-1, 1).long()).squeeze(1) - _best_other(logits, labels.long())


def misclassification_loss(logits: Tensor, labels: Tensor, target: int | None, kappa: float = 0.0) -> Tensor:
    """Targeted (``target`` a class) or untargeted (``target=None``) margin, floored at ``-kappa``: past that margin
    an example stops pushing (the C&W-style floor of the authors' "C_W2" loss)."""
    margin = untargeted_margin(logits, labels) if target is None else targeted_margin(logits, target)
    return margin.clamp_min(-kappa)


def ain_loss(
    distance: Tensor, imitation: Tensor, misclassification: Tensor, beta_d: float, beta_m: float, beta_c: float
) -> Tensor:
    """``L = b_d L_d + b_m L_m + b_c L_c`` (Eq 5.1) per example."""
    return beta_d * distance + beta_m * imitation + beta_c * misclassification


__all__ = [
    "ain_loss",
    "distance_loss",
    "imitation_loss",
    "misclassification_loss",
    "targeted_margin",
    "untargeted_margin",
]
