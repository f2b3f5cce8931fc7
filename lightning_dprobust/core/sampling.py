"""Poisson subsampling, the sampling that the DP-SGD accountants assume (Abadi et al. 2016; Mironov et al. 2019).

Each step includes every example independently with probability ``sample_rate``, so the batch size varies and
may be zero. Under data parallelism all ranks draw the *same* global Bernoulli mask from a shared seed and each
rank keeps the selected indices ``rank::world_size``: the union over ranks is exactly one Poisson sample of the
whole dataset, and every rank yields the same number of batches (empty ones included), so collectives never
mismatch.

Each mask comes from its own generator, keyed by :func:`keyed_generator` with the sampler's seed, the epoch and the
step, never from the global torch RNG: neither ``seed_everything`` nor an attack that reseeds the global RNG can
change or reveal a mask. The seed itself is the caller's secret (``DPCallback`` derives it from operating-system
entropy).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator

import torch
from torch.utils.data import Sampler
from torch.utils.data._utils.collate import default_collate

from lightning_dprobust.core.labels import SECRET_LABEL as SECRET_LABEL  # re-exported: the labels live in a
from lightning_dprobust.core.labels import SEEDED_LABEL as SEEDED_LABEL  # torch-free module (zoo catalog)


class PoissonBatchSampler(Sampler[list[int]]):
    """Yields ``steps_per_epoch`` Poisson batches of indices per epoch.

    Args:
        num_examples: size of the (global) training set.
        sample_rate: inclusion probability ``q`` of each example at each step.
        steps_per_epoch: number of batches per epoch; default ``max(1, round(1 / q))``, so one epoch sees each
            example once in expectation.
        seed: the shared secret of the masks (any non-negative int; ``DPCallback`` passes a 128-bit key from
            :func:`derive_key`); the mask of step ``s`` of epoch ``e`` is a function of ``(seed, e, s)`` only, and
            finding it means finding ``seed``.
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
            generator = keyed_generator("cpu", self.seed, "mask", self.epoch, step)
            mask = torch.rand(self.num_examples, generator=generator) < self.sample_rate
            selected = mask.nonzero().flatten()
            yield selected[self.rank :: self.world_size].tolist()


KEY_BITS = 128
"""Bits of a key from :func:`derive_key`: as many as the operating-system secret ``DPCallback`` draws."""


def derive_key(*keys: int | str) -> int:
    """A ``KEY_BITS``-bit key from ``keys`` (a secret first, then stream labels and counters), via BLAKE2b.

    Use it where a derived value keys further streams (the first key of :func:`keyed_generator`, the ``seed`` of
    :class:`PoissonBatchSampler`): it keeps up to ``KEY_BITS`` bits of the secret's entropy, where
    :func:`derive_seed`'s 63 bits would make every stream keyed from it one of 2^63 whatever the secret's size.
    Distinct keys give unrelated keys.
    """
    digest = hashlib.blake2b(repr(keys).encode(), digest_size=KEY_BITS // 8).digest()
    return int.from_bytes(digest, "little")


def derive_seed(*keys: int | str) -> int:
    """A 63-bit generator seed from ``keys`` (a secret first, then stream labels and counters), via BLAKE2b.

    Distinct keys give unrelated seeds, so one secret feeds many independent streams (the mask of each step, the
    noise of each step) and a stream is never replayed as long as its counter never repeats.
    """
    digest = hashlib.blake2b(repr(keys).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


MT19937_WORDS = 624
"""Words of 32 bits in the state of torch's CPU generator (Mersenne Twister MT19937)."""
_MT_STATE_OFFSET = 24
"""Byte offset of those words in ``torch.Generator.get_state()`` on CPU, after the initial seed (8 bytes), two
counters (4 + 4) and the next index (8); each word is stored in 8 bytes, in the machine's byte order. Checked at every
use."""


def keyed_generator(device: torch.device | str, *keys: int | str) -> torch.Generator:
    """A generator on ``device`` whose whole state follows from ``keys`` (a secret first, then stream labels and
    counters): the same keys give the same stream, and nothing less than the keys' secret gives it.

    ``manual_seed`` alone does not achieve that on CPU: torch's CPU generator keeps only the low 32 bits of its seed
    (``manual_seed(s)`` and ``manual_seed(s + 2**32)`` give the same stream), so a CPU stream seeded from any secret
    is one of 2^32. That is few enough to search: for each candidate, regenerate a step's noise and keep the one that
    explains the update between two released checkpoints (its residual is the clipped sum, of norm at most the batch
    size times the clip, while a wrong candidate leaves noise of norm ``sigma C sqrt(d)``), then subtract it. Here the
    CPU generator's 624 state words (19,968 bits) are SHAKE-256 of the keys, so finding the stream means finding the
    keys' secret (``DPCallback``: 128 bits from the operating system). CUDA's generator (Philox) uses all 64 bits of its
    seed; it is seeded with :func:`derive_seed`'s 63.

    Raises:
        RuntimeError: if torch's CPU generator state is not laid out as this function expects (a future torch): it
            refuses rather than fall back to a 32-bit seed.
    """
    generator = torch.Generator(device=device)
    if generator.device.type != "cpu":
        return generator.manual_seed(derive_seed(*keys))
    generator.manual_seed(0)  # a known state, so that the layout can be checked; every word is replaced below
    state = generator.get_state()
    if state.numel() < _MT_STATE_OFFSET + 8 * MT19937_WORDS or _state_words(state)[:3].tolist() != [0, 1, 1812433255]:
        raise RuntimeError(  # [0, 1, 1812433255]: MT19937's first words when seeded with 0
            "torch's CPU generator state has an unexpected layout, so it cannot be keyed with the full secret; "
            "refusing to fall back to a 32-bit seed (run on CUDA, or use a torch version whose CPU generator keeps "
            "its 624 Mersenne Twister words at byte 24 of get_state())"
        )
    digest = hashlib.shake_256(repr(("mt19937", *keys)).encode()).digest(4 * MT19937_WORDS)
    words = torch.frombuffer(bytearray(digest), dtype=torch.int32).to(torch.int64) & 0xFFFFFFFF
    _state_words(state).copy_(words)
    generator.set_state(state)
    if not torch.equal(_state_words(generator.get_state()), words):
        raise RuntimeError("torch's CPU generator did not take the keyed state; refusing to fall back to a 32-bit seed")
    return generator


def _state_words(state: torch.Tensor) -> torch.Tensor:
    """The MT19937 words of a CPU generator state, as a writable ``int64`` view (native byte order, as torch's)."""
    return state[_MT_STATE_OFFSET : _MT_STATE_OFFSET + 8 * MT19937_WORDS].view(torch.int64)


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


__all__ = ["EmptySafeCollate", "PoissonBatchSampler", "derive_key", "derive_seed", "keyed_generator"]
