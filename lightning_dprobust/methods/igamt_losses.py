"""The losses of IGAMT (Tang 2021, thesis Eqs 4.1-4.6 and the EDGAMT additions of App. .1), per example.

Every function returns a ``[B]`` tensor whose entry ``i`` reads example ``i`` of its arguments only, so the shared
per-example engine can clip it. ``x * m`` is the masked data ("x x m" in the thesis); critics return ``[B]`` scores.
All adversarial terms are WGAN terms (thesis 4.2.3); :func:`gradient_penalty` is the WGAN-GP term (Gulrajani et al.
2017, arXiv 1704.00028) that the thesis code puts on every critic.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.func import grad

Critic = Callable[[Tensor], Tensor]
_EPS = 1e-6


def _per_example_mean(values: Tensor) -> Tensor:
    return values.flatten(start_dim=1).mean(dim=1)


def reconstruction(x: Tensor, m: Tensor, x_hat: Tensor, m_hat: Tensor) -> Tensor:
    """``xEntropy(x m, x^ m^) + xEntropy(m, m^)`` (thesis 4.2.2), averaged over steps and features."""
    data = F.binary_cross_entropy((x_hat * m_hat).clamp(_EPS, 1 - _EPS), x * m, reduction="none")
    mask = F.binary_cross_entropy(m_hat.clamp(_EPS, 1 - _EPS), m, reduction="none")
    return _per_example_mean(data) + _per_example_mean(mask)


def masked_mse(a: Tensor, b: Tensor) -> Tensor:
    """Per-example mean squared error."""
    return _per_example_mean((a - b) ** 2)


def critic_loss(real: Tensor, fakes: Sequence[Tensor], real_weight: float | None = None) -> Tensor:
    """Eq 4.1 / 4.2 / EDGAMT ``l_dm``: ``sum_k D(fake_k) - w D(real)``; ``w`` defaults to the number of fakes (3 in
    Eq 4.1; Algorithm 1 line 12 prints 1)."""
    weight = len(fakes) if real_weight is None else real_weight
    return torch.stack(list(fakes)).sum(dim=0) - weight * real


def decoder_adversarial(dx_fakes: Sequence[Tensor], dm_fakes: Sequence[Tensor] = ()) -> Tensor:
    """``l_de`` (Eq 4.3, EDGAMT): ``-(D_x(x^ m^) + D_x(x~ m~)) - (D_m(m^) + D_m(m~))``."""
    return -torch.stack(list(dx_fakes) + list(dm_fakes)).sum(dim=0)


def imitation(
    dx_imitated: Tensor,
    dm_imitated: Tensor | None,
    imitated: Tensor,
    targets: Sequence[Tensor],
) -> Tensor:
    """``l_imi = l_di + l_im`` (Eq 4.5, EDGAMT): ``-D_x(x- m-) - D_m(m-) + sum_t MSE(t, x- m-)`` over ``targets``
    (the thesis: ``x^ m^``, ``x~ m~`` and the real ``x m``; ``strict_dp`` keeps only ``x~ m~``)."""
    loss = -dx_imitated if dm_imitated is None else -dx_imitated - dm_imitated
    for target in targets:
        loss = loss + masked_mse(target, imitated)
    return loss


def gradient_penalty(critic: Critic, real: Tensor, fake: Tensor, alpha: Tensor) -> Tensor:
    """``(||grad_u D(u)|| - 1)^2`` at ``u = alpha real + (1 - alpha) fake`` (``alpha``: ``[B]``), per example.

    Written with ``torch.func.grad`` so that it composes with the per-example engine's ``vmap(grad(...))``.
    """
    shape = (-1,) + (1,) * (real.dim() - 1)
    mixed = alpha.reshape(shape) * real + (1 - alpha.reshape(shape)) * fake
    slopes = grad(lambda u: critic(u).sum())(mixed)
    norms = torch.sqrt(slopes.flatten(start_dim=1).pow(2).sum(dim=1) + 1e-12)
    return (norms - 1) ** 2
