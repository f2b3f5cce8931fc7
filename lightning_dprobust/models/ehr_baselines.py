"""Building blocks of the EHR baselines (VAE, GAN, VAE-GAN, AAE, DAAE) on top of IGAMT's sequence modules.

The baselines share IGAMT's data contract (``x, m`` ``[B, 1 + T, F]``), its transformer encoder, its causal decoder
(:class:`~lightning_dprobust.models.ehr_transformer.EHRDecoder`, autoregressive at synthesis) and its latent MLP
(:class:`~lightning_dprobust.models.ehr_transformer.Generator`); they only add what IGAMT does not have: an encoder
head onto a Gaussian code and a critic that sees data and mask together. Every module here is free of cross-example
layers, so the per-example DP engine computes exact per-example gradients.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from lightning_dprobust.models.ehr_transformer import EHREncoder


class CodeEncoder(nn.Module):
    """``(x, m) -> (mu, logvar)`` of a ``code_size`` Gaussian code: :class:`EHREncoder` plus a linear head.

    A deterministic encoder (AAE) uses ``mu`` alone.
    """

    def __init__(self, encoder: EHREncoder, d_model: int, code_size: int) -> None:
        super().__init__()
        self.encoder = encoder
        self.head = nn.Linear(d_model, 2 * code_size)

    def forward(self, x: Tensor, m: Tensor) -> tuple[Tensor, Tensor]:
        mu, logvar = self.head(self.encoder(x, m)).chunk(2, dim=-1)
        return mu, logvar.clamp(-10.0, 10.0)


def data_and_mask(x: Tensor, m: Tensor) -> Tensor:
    """``[x m, m]`` ``[B, L, 2F]``: what the baselines' data critic (a ``SequenceCritic(2F)``) sees.

    The baselines have no mask critic of their own (IGAMT's D_m); seeing the mask next to the data is how they are
    "adapted to take and generate EHR + mask" (thesis 4.3.1).
    """
    return torch.cat([x * m, m], dim=-1)


def gaussian_kl(mu: Tensor, logvar: Tensor) -> Tensor:
    """``KL(N(mu, exp(logvar)) || N(0, I))`` per example, averaged over the code's coordinates."""
    return 0.5 * (mu.pow(2) + logvar.exp() - 1.0 - logvar).mean(dim=-1)
