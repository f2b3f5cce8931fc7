"""The losses of IGAMT (Tang 2021, thesis Eqs 4.1-4.6 and the EDGAMT additions of App. .1), per example.

Every function returns a ``[B]`` tensor whose entry ``i`` reads example ``i`` of its arguments only, so the shared
per-example engine can clip it. ``x * m`` is the masked data ("x x m" in the thesis); critics return ``[B]`` scores.
All adversarial terms are WGAN terms (thesis 4.2.3); :func:`gradient_penalty` is the WGAN-GP term (Gulrajani et al.
2017, arXiv 1704.00028) that the thesis code puts on every critic.

Two reductions of the reconstruction and imitation terms (:data:`LOSS_FORMS`):

* ``"authors"``: the authors' code (Temporal-Synthesization, ``code/nn/transformers/mixed_embedding_transformer.py``,
  ``Transformer.compute_recon_loss`` / ``compute_mask_loss``, used by ``code/utils/ehr/igat/igamt_utils.py``):
  squared errors and cross-entropies **summed** over steps and features; the data term averages the unmasked and the
  masked comparison, ``(l(a, b) + l(a m_a, b m_b)) / 2``, and the masks are compared on their own (``mask_loss``,
  ``*_m_match_loss``).
* ``"thesis"``: the thesis text (Eqs 4.4, 4.5): means over steps and features of the masked data only, no mask term
  in the imitation.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.func import grad

Critic = Callable[[Tensor], Tensor]
LossForm = Literal["authors", "thesis"]
LOSS_FORMS = ("authors", "thesis")
Record = tuple[Tensor, Tensor]
"""``(x, m)``: values and mask, ``[B, T, F]`` each."""
_EPS = 1e-6


def _reduce(values: Tensor, form: LossForm) -> Tensor:
    """Per example: the sum (``"authors"``) or the mean (``"thesis"``) over every non-batch dimension."""
    flat = values.flatten(start_dim=1)
    return flat.sum(dim=1) if form == "authors" else flat.mean(dim=1)


def _bce(prediction: Tensor, target: Tensor) -> Tensor:
    return F.binary_cross_entropy(prediction.clamp(_EPS, 1 - _EPS), target, reduction="none")


def reconstruction_terms(x: Tensor, m: Tensor, x_hat: Tensor, m_hat: Tensor, form: LossForm = "authors") -> Record:
    """``(data, mask)`` cross-entropy terms of ``l_recon`` (thesis 4.2.2), per example.

    ``"authors"``: ``data = (xEnt(x, x^) + xEnt(x m, x^ m^)) / 2`` and ``mask = xEnt(m, m^)``, summed over steps and
    features (``compute_recon_loss`` / ``compute_mask_loss`` with ``type="xent"``). ``"thesis"``: ``data = xEnt(x m,
    x^ m^)``, ``mask = xEnt(m, m^)``, averaged over steps and features. Predictions are clamped to ``[1e-6, 1 - 1e-6]``
    (the code adds ``1e-12`` inside the logarithm instead).
    """
    masked = _reduce(_bce(x_hat * m_hat, x * m), form)
    data = (_reduce(_bce(x_hat, x), form) + masked) / 2 if form == "authors" else masked
    return data, _reduce(_bce(m_hat, m), form)


def reconstruction(x: Tensor, m: Tensor, x_hat: Tensor, m_hat: Tensor) -> Tensor:
    """``xEntropy(x m, x^ m^) + xEntropy(m, m^)`` (thesis 4.2.2), averaged over steps and features: the thesis form
    of :func:`reconstruction_terms`, added (the baselines' reconstruction, ``methods/ehr_baselines.py``)."""
    data, mask = reconstruction_terms(x, m, x_hat, m_hat, "thesis")
    return data + mask


def match(imitated: Record, target: Record, form: LossForm = "authors") -> Tensor:
    """One imitation target's squared error, per example.

    ``"authors"``: ``(SE(x-, x_t) + SE(x- m-, x_t m_t)) / 2 + SE(m-, m_t)`` summed over steps and features
    (``compute_recon_loss`` and ``compute_mask_loss`` with ``type="mse"``: ``*_match_loss`` + ``*_m_match_loss``).
    ``"thesis"``: ``MSE(x_t m_t, x- m-)`` averaged over steps and features (Eq 4.5).
    """
    (x_imi, m_imi), (x_t, m_t) = imitated, target
    masked = _reduce((x_imi * m_imi - x_t * m_t) ** 2, form)
    if form == "thesis":
        return masked
    return (_reduce((x_imi - x_t) ** 2, form) + masked) / 2 + _reduce((m_imi - m_t) ** 2, form)


def critic_loss(real: Tensor, fakes: Sequence[Tensor], real_weight: float | None = None) -> Tensor:
    """Eq 4.1 / 4.2 / EDGAMT ``l_dm``: ``sum_k D(fake_k) - w D(real)``; ``w`` defaults to the number of fakes (3 in
    Eq 4.1; Algorithm 1 line 12 prints 1)."""
    weight = len(fakes) if real_weight is None else real_weight
    return torch.stack(list(fakes)).sum(dim=0) - weight * real


def decoder_adversarial(dx_fakes: Sequence[Tensor], dm_fakes: Sequence[Tensor] = ()) -> Tensor:
    """``l_de`` (Eq 4.3, EDGAMT): ``-(D_x(x^ m^) + D_x(x~ m~)) - (D_m(m^) + D_m(m~))``."""
    return -torch.stack(list(dx_fakes) + list(dm_fakes)).sum(dim=0)


def imitation_adversarial(dx_imitated: Tensor, dm_imitated: Tensor | None) -> Tensor:
    """``l_di`` (Eq 4.5, EDGAMT): ``-D_x(x- m-) - D_m(m-)`` (no ``D_m`` term without a mask critic)."""
    return -dx_imitated if dm_imitated is None else -dx_imitated - dm_imitated


def imitation_match(imitated: Record, targets: Sequence[Record], form: LossForm = "authors") -> Tensor:
    """``l_im``: :func:`match` summed over ``targets`` (the thesis and the code: Dec's synthesis ``(x~, m~)``, Dec's
    reconstruction ``(x^, m^)`` and the real ``(x, m)``; ``strict_dp`` keeps only ``(x~, m~)``)."""
    loss = torch.zeros(imitated[0].shape[0], device=imitated[0].device)
    for target in targets:
        loss = loss + match(imitated, target, form)
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
