"""Deliberately broken DP-SGD mechanisms, to check that an audit catches a mechanism that leaks more than it claims.

Never use these to train a model that is released: each voids the guarantee the run reports.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from torch import Tensor


@contextlib.contextmanager
def replayed_noise() -> Iterator[None]:
    """Within the block, every ``DPCallback`` step adds the noise drawn at the first step (the fault of a generator
    that is reseeded every step): the noise cancels in the difference of two steps while the ledger counts fresh
    noise. Patches the one function through which ``DPCallback`` draws its Gaussian noise and restores it on exit.
    """
    from lightning_dprobust.callbacks import dp
    from lightning_dprobust.core.per_sample import gaussian_noise_like

    original = dp.add_noise_and_scale_
    first: dict[str, Tensor] = {}

    def replay(grads, std, scale, generator=None):
        if not first:
            first.update(gaussian_noise_like(grads, std, generator))
        for name, g in grads.items():
            g.add_(first[name]).mul_(scale)
        return grads

    dp.add_noise_and_scale_ = replay
    try:
        yield
    finally:
        dp.add_noise_and_scale_ = original


__all__ = ["replayed_noise"]
