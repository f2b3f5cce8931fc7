"""Poisson subsampling, the sampling that the DP-SGD accountants assume (Abadi et al. 2016; Mironov et al. 2019).

Each step includes every example independently with probability ``sample_rate``, so the batch size varies and
may be zero. Under data parallelism all ranks draw the *same* global Bernoulli mask from a shared seed and each
rank keeps the selected indices ``rank::world_size``: the union over ranks is exactly one Poisson sample of the
whole dataset, and every rank yields the same number of batches (empty ones included), so collectives never
mismatch.

Each mask comes from its own generator, seeded by :func:`derive_seed` from the sampler's seed, the epoch and the
step, never from the global torch RNG: neither ``seed_everything`` nor an attack that reseeds the global RNG can
change or reveal a mask. The seed itself is the caller's secret (``DPCallback`` draws it from the operating system).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator

import torch
from torch.utils.data import Sampler
from torch.utils.data._utils.collate import default_collate


class PoissonBatchSampler(Sampler[list[int]]):
    """Yields ``steps_per_epoch`` Poisson batches of indices per epoch.

    Args:
        num_examples: size of the (global) training set.
        sample_rate: inclusion probability ``q`` of each example at each step.
        steps_per_epoch: number of batches per epoch; default ``max(1, round(1 / q))``, so one epoch sees each
            example once in expectation.
        seed: the shared secret of the masks (any non-negative int, e.g. 128 random bits); the mask of step ``s`` of
            epoch ``e`` is a function of ``(seed, e, s)`` only.
        rank: this process' rank.
        world_size: number of data-parallel processes.

    Guarantees:
        Over all ranks, each step's batch contains every example independently with probability ``sample_rate``,
        and no mask is drawn twice: Lightning reaches :meth:`set_epoch` through the :attr:`sampler` alias (it calls
        ``loader.batch_sampler.sampler.set_epoch``), and after a mid-epoch resume :meth:`resume_at` skips the masks
        the checkpoint already trained, so a resumed run draws exactly the masks of an unbroken one.
    """

    def __init__(
        self,
        num_examples: int,
        sample_rate: float,
        steps_per_epoch: int | None = None,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
    ) -> None:
        if num_examples < 1:
            raise ValueError(f"Poisson sampling needs a non-empty training set, got {num_examples} examples")
        if not 0.0 < sample_rate <= 1.0:
            raise ValueError(f"sample_rate must lie in (0, 1], got {sample_rate}: lower the batch size")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} outside [0, {world_size})")
        self.num_examples = num_examples
        self.sample_rate = sample_rate
        self.steps_per_epoch = steps_per_epoch or max(1, round(1.0 / sample_rate))
        self.seed = seed
        self.rank = rank
        self.world_size = world_size
        self.epoch = 0
        self._resume: tuple[int, int] = (0, 0)

    @property
    def sampler(self) -> PoissonBatchSampler:
        """This sampler itself: Lightning calls ``set_epoch`` on ``loader.batch_sampler.sampler`` at each epoch."""
        return self

    def resume_at(self, epoch: int, batches: int) -> None:
        """Skip the first ``batches`` masks of ``epoch`` (already trained before a checkpoint) when it is iterated."""
        self._resume = (epoch, batches)

    def set_epoch(self, epoch: int) -> None:
        """Called by Lightning at each epoch start so that every epoch draws fresh masks."""
        self.epoch = epoch

    def __len__(self) -> int:
        return self.steps_per_epoch

    def __iter__(self) -> Iterator[list[int]]:
        skip = self._resume[1] if self._resume[0] == self.epoch else 0
        self._resume = (0, 0)
        for step in range(skip, self.steps_per_epoch):
            generator = torch.Generator().manual_seed(derive_seed(self.seed, "mask", self.epoch, step))
            mask = torch.rand(self.num_examples, generator=generator) < self.sample_rate
            selected = mask.nonzero().flatten()
            yield selected[self.rank :: self.world_size].tolist()


def derive_seed(*keys: int | str) -> int:
    """A 63-bit generator seed from ``keys`` (a secret first, then stream labels and counters), via BLAKE2b.

    Distinct keys give unrelated seeds, so one secret feeds many independent streams (the mask of each step, the
    noise of each step) and a stream is never replayed as long as its counter never repeats.
    """
    digest = hashlib.blake2b(repr(keys).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


class EmptySafeCollate:
    """Collates a list of examples; an empty list becomes zero-length tensors shaped like a real batch.

    Poisson batches can be empty; the DP step must still run (it then releases pure noise, which is what the
    accountant assumes).
    """

    def __init__(self, dataset, collate_fn=default_collate) -> None:
        self.collate_fn = collate_fn
        self._template = collate_fn([dataset[0]])

    def __call__(self, examples: list):
        if examples:
            return self.collate_fn(examples)
        return _slice_empty(self._template)


def _slice_empty(batch):
    if isinstance(batch, torch.Tensor):
        return batch[:0]
    if isinstance(batch, (list, tuple)):
        return type(batch)(_slice_empty(item) for item in batch)
    if isinstance(batch, dict):
        return {key: _slice_empty(value) for key, value in batch.items()}
    raise TypeError(f"cannot build an empty batch from an element of type {type(batch).__name__}")


__all__ = ["EmptySafeCollate", "PoissonBatchSampler", "derive_seed"]
