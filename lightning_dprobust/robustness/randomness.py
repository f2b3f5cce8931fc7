"""Attacks on their own randomness: an attack never reads, advances or reseeds anyone else's random stream.

torchattacks draws its random starts from the global torch RNG, and APGD, APGDT, FAB and Square (so AutoAttack) call
``torch.manual_seed`` on it at every run (torchattacks 3.5.1, ``perturb``). Run inside a training loop, an attack would
then decide every draw that follows it: dropout, augmentations, and any noise still taken from the global RNG.
:class:`AttackRandomness` runs each attack inside :func:`isolated_rng`, seeded from the attack's own generator, so

* the global torch RNG (CPU and every initialized CUDA device), NumPy's and Python's global RNGs are exactly as before
  the attack, whatever the attack does to them;
* an attack's draws depend only on its own generator: its results do not depend on which other attacks run, nor on
  how much randomness the rest of the program used.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch
from torch import Tensor
from torchattacks.attack import Attack

_SEED_BOUND = 2**63 - 1


def attack_seed(seed: int, name: str) -> int:
    """A seed in ``[0, 2**63)`` derived from ``seed`` and an attack's ``name`` (SHA-256: stable across processes).

    Two names give unrelated seeds, so ``dprobust attack --seed S`` gives each requested attack its own stream and an
    attack's result does not depend on the other attacks of the command.
    """
    digest = hashlib.sha256(f"{int(seed)}:{name}".encode()).digest()
    return int.from_bytes(digest[:8], "little") % _SEED_BOUND


@contextmanager
def isolated_rng() -> Iterator[None]:
    """Restore the global torch (CPU and initialized CUDA devices), NumPy and Python RNG states on exit.

    Whatever the block draws or reseeds (``torch.manual_seed`` included, which also reseeds every CUDA device), the
    code after the block sees the same random streams as if the block had not run.
    """
    devices = list(range(torch.cuda.device_count())) if torch.cuda.is_initialized() else []
    numpy_state, python_state = np.random.get_state(), random.getstate()
    try:
        with torch.random.fork_rng(devices=devices):
            yield
    finally:
        np.random.set_state(numpy_state)
        random.setstate(python_state)


class AttackRandomness:
    """An attack's own random stream: each run draws a fresh seed from it and runs inside :func:`isolated_rng`.

    Guarantees: the global RNGs are untouched by a run (see :func:`isolated_rng`); the ``k``-th run's draws are a
    function of ``seed`` and ``k`` alone; the stream survives a checkpoint through :meth:`state_dict`.

    Args:
        seed: seed of the stream (attack randomness is not secret: nothing in a privacy proof relies on it).
    """

    def __init__(self, seed: int) -> None:
        self.generator = torch.Generator().manual_seed(int(seed) % _SEED_BOUND)

    def run(self, attack: Attack, images: Tensor, labels: Tensor) -> Tensor:
        """``attack(images, labels)`` on this stream, detached."""
        run_seed = int(torch.randint(0, _SEED_BOUND, (1,), generator=self.generator))
        with isolated_rng():
            seed_everything_quietly(run_seed)
            return attack(images, labels).detach()

    def state_dict(self) -> dict[str, Any]:
        return {"generator": self.generator.get_state()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.generator.set_state(state_dict["generator"])


def seed_everything_quietly(seed: int) -> None:
    """Seed the global torch (CPU and initialized CUDA devices), NumPy and Python RNGs; for use in :func:`isolated_rng`.

    CUDA is seeded only when initialized: ``torch.manual_seed`` would otherwise queue the seed until CUDA starts,
    outside the isolated block.
    """
    torch.random.default_generator.manual_seed(seed)
    if torch.cuda.is_initialized():
        torch.cuda.manual_seed_all(seed)
    np.random.seed(seed % 2**32)
    random.seed(seed)


__all__ = ["AttackRandomness", "attack_seed", "isolated_rng", "seed_everything_quietly"]
