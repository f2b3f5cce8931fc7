"""The secret randomness of ``DPCallback``: where its Poisson masks and Gaussian noise come from.

DP-SGD's proof (Abadi et al. 2016) assumes the adversary does not know which examples each step sampled nor the
noise it added. Both therefore come from generators this module seeds itself, never from the global torch RNG, which
``seed_everything``, a config file, or an attack calling ``torch.manual_seed`` (torchattacks' APGD, FAB, Square do)
would make known or replay.
"""

from __future__ import annotations

import secrets
from typing import Any

import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_warn
from lightning.pytorch.utilities.exceptions import MisconfigurationException

from lightning_dprobust.core.sampling import SECRET_LABEL, SEEDED_LABEL, derive_key, keyed_generator

SECRET_BITS = 128


class DPRandomness:
    """Seeds of the Poisson masks and of the DP noise, independent of every other source of randomness.

    Secret mode (``seed=None``, the default): each ``fit`` draws a fresh ``SECRET_BITS``-bit root from the operating
    system (:mod:`secrets`); under DDP rank 0's root is broadcast so that all ranks draw one global mask per step. The
    mask of step ``s`` of epoch ``e`` is keyed by ``(derive_key(root, fit), e, s)`` and the noise of the ``k``-th
    private step by ``(root, k)`` (:func:`~lightning_dprobust.core.sampling.keyed_generator`: on CPU the generator's
    whole state is derived from the keys, since a ``manual_seed`` keeps only 32 bits there). Both thus carry the
    root's 128 bits: recovering a mask or a CPU noise draw means recovering the root (CUDA's generator takes a 64-bit
    seed, so CUDA noise carries 63 of them). The root is never written anywhere: not
    into checkpoints, logs or released weights. A resumed or repeated ``fit`` therefore draws fresh masks and noise.
    This is deliberate: a checkpoint holding the generator state would let whoever reads it regenerate the noise of
    every step taken (Mersenne Twister and Philox states can be run backwards), subtract it from consecutive
    checkpoints' parameters and recover the clipped gradient sums, i.e. the guarantee would rest on the checkpoint
    file staying secret. The price is that an interrupted run equals an uninterrupted one in distribution, not bit
    for bit.

    Seed mode (``seed=<int>``): the root is the seed (warned: the guarantee then assumes the seed is secret and
    trains one model). The checkpoint holds the counters (the fit index; the private-step count is the ledger's), so
    a resume continues exactly where the run stopped and never reseeds: an interrupted run equals an uninterrupted
    one bit for bit. A second ``fit`` with the same callback uses the next fit index and the next step counters, so
    it never replays masks or noise either.

    What remains (``docs/sharp_edges.md``): torch's generators are not cryptographic, floating-point Gaussian
    sampling leaks through its least significant bits (Mironov 2012), and timing is not constant.
    """

    def __init__(self, seed: int | None = None, owner: str = "DPCallback") -> None:
        if seed is not None:
            if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
                raise MisconfigurationException(
                    f"{owner}(seed={seed!r}) must be a non-negative int, or None (the default) for secret randomness"
                )
            rank_zero_warn(
                f"{owner}(seed={seed}): reproducibility mode. The Poisson masks and the noise follow from the seed, "
                "so the privacy guarantee holds only if the seed stays secret and trains a single model; remove "
                "`seed` for secret randomness drawn from the operating system"
            )
        self.seed = seed
        self._fit_index = 0
        self._root: int | None = None

    @property
    def secret(self) -> bool:
        """True unless an explicit seed was given."""
        return self.seed is None

    @property
    def label(self) -> str:
        """:data:`SECRET_LABEL`, or :data:`SEEDED_LABEL` in seed mode: what a privacy record says of the randomness."""
        return SECRET_LABEL if self.secret else SEEDED_LABEL

    def next_fit(self) -> None:
        """Count a new ``fit`` (call in ``setup``; a resume then restores the count of the run it continues)."""
        self._fit_index += 1

    def start(self, trainer: L.Trainer) -> None:
        """Fix the root of this ``fit`` (call after the checkpoint is restored and before any draw)."""
        if self.seed is not None:
            self._root = self.seed
            return
        root = secrets.randbits(SECRET_BITS)
        if trainer.world_size > 1:
            root = trainer.strategy.broadcast(root, src=0)
        self._root = root

    def mask_seed(self) -> int:
        """The 128-bit key of this fit's Poisson masks, derived from the whole root (the same on every rank;
        :func:`~lightning_dprobust.core.sampling.derive_key`)."""
        return derive_key(self._require_root(), "masks", self._fit_index)

    def noise_generator(self, step: int, device: torch.device) -> torch.Generator:
        """A generator on ``device`` for the noise of the ``step``-th private step (counted over the whole ledger)."""
        return keyed_generator(device, self._require_root(), "noise", step)

    def state_dict(self) -> dict[str, Any]:
        """Seed mode: the fit index; secret mode: nothing (a resume draws fresh entropy)."""
        return {} if self.secret else {"fit_index": self._fit_index}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if not self.secret and "fit_index" in state:
            self._fit_index = int(state["fit_index"])

    def _require_root(self) -> int:
        if self._root is None:
            raise RuntimeError("secret randomness was drawn before fit started; call trainer.fit(...)")
        return self._root
