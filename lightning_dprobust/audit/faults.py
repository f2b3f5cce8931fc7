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

    original = dp.gaussian_noise_like
    first: dict[str, Tensor] = {}

    def replay(grads, std, *args, **kwargs) -> dict[str, Tensor]:
        if not first:
            first.update(original(grads, std, *args, **kwargs))
        return {name: noise.clone() for name, noise in first.items()}

    dp.gaussian_noise_like = replay
    try:
        yield
    finally:
        dp.gaussian_noise_like = original


__all__ = ["replayed_noise"]
