"""Score a trained EHR generator: draw from its released artifact, compare with real records (thesis section 4.3)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from lightning_dprobust.metrics.synthetic import DEFAULT_FEATURES, similarity_report


def evaluate_generator(
    release: Any,
    real: tuple[Tensor, Tensor],
    seed: int = 0,
    features: Sequence[int] = DEFAULT_FEATURES,
    mask: str = "bernoulli",
) -> tuple[dict[str, float], tuple[Tensor, Tensor]]:
    """Synthesize ``len(real)`` records of as many steps as the real ones from ``release`` (a released artifact,
    ``models/ehr_release.py``, e.g. ``module.release()``: nothing else is used; draws from a generator seeded by
    ``seed``; ``mask`` as :meth:`ReleasedSynthesizer.sample`) and score them against ``real`` with
    :func:`similarity_report` (k-means seed ``seed``); returns the report and the synthetic ``(x, m)``."""
    x_real, m_real = real
    generator = torch.Generator().manual_seed(seed)
    synthetic = release.cpu().sample(len(x_real), x_real.shape[1] - 1, generator, mask)
    return similarity_report((x_real, m_real), synthetic, features=features, seed=seed), synthetic
