"""The Poisson train loader of ``DPCallback``, built from the data module's own train loader."""

from __future__ import annotations

from collections.abc import Callable

import lightning as L
from lightning.pytorch.utilities import rank_zero_warn
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from torch.utils.data import BatchSampler, DataLoader, IterableDataset, RandomSampler, SequentialSampler

from lightning_dprobust.core.sampling import EmptySafeCollate, PoissonBatchSampler


class PoissonLoaderFactory:
    """Replaces the train loader of a data module (or module) by a Poisson-sampled one, and knows its rate.

    Args:
        sample_rate: inclusion probability; default ``batch_size * world_size / len(dataset)``.
        mask_seed: returns the (secret) key of the Poisson masks, the same on every rank (``DPCallback``: 128 bits
            derived from its root); called each time the loader is built.
        poisson: ``False`` keeps the original loader, which must shuffle uniformly without replacement; the
            accountant then assumes Poisson sampling at rate ``batch_size * world_size / n`` although batches are
            shuffled, which is only an approximation.
    """

    def __init__(self, sample_rate: float | None, mask_seed: Callable[[], int], poisson: bool) -> None:
        self.requested_rate = sample_rate
        self.mask_seed = mask_seed
        self.poisson = poisson
        self.sample_rate: float | None = None
        self.num_examples: int | None = None
        self.steps_per_epoch: int | None = None
        self._source: object | None = None
        self._built: DataLoader | None = None

    def attach(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Route the train loader of the data module (or of the module) through :meth:`_build`."""
        if not self.poisson:
            return
        source = trainer.datamodule if trainer.datamodule is not None else pl_module
        original = source.train_dataloader
        self._source = source
        world_size, rank = trainer.world_size, trainer.global_rank

        def train_dataloader() -> DataLoader:
            self._built = self._build(original(), rank, world_size)
            self._built.batch_sampler.resume_at(*_trained_position(trainer))
            return self._built

        source.train_dataloader = train_dataloader

    def detach(self) -> None:
        if self._source is not None and "train_dataloader" in vars(self._source):
            del self._source.train_dataloader
        self._source = None

    def check_train_loader(self, loader: object, world_size: int) -> None:
        """Refuse a train loader this factory did not build; with the opt-out, adopt the loader as it is."""
        if not self.poisson:
            self._adopt(loader, world_size)
        elif self._built is None or loader is not self._built:
            raise MisconfigurationException(
                "DPCallback: the train loader in use was not built by DPCallback, so its batches are not Poisson "
                "samples; let the callback build it (define train_dataloader() on the data module) or pass "
                "DPCallback(poisson_sampling=False) to accept approximate accounting"
            )

    def _adopt(self, loader: object, world_size: int) -> None:
        self._measure(loader, world_size)
        _check_uniform_shuffle(loader)
        self.steps_per_epoch = len(loader)
        rank_zero_warn(
            "DPCallback(poisson_sampling=False): batches are shuffled, not Poisson-sampled; the reported "
            "epsilon assumes Poisson sampling and is only an approximation"
        )

    def _measure(self, loader: object, world_size: int) -> None:
        if not isinstance(loader, DataLoader) or isinstance(loader.dataset, IterableDataset):
            raise MisconfigurationException(
                "DPCallback needs a map-style DataLoader (len + indexing) to Poisson-sample; got "
                f"{type(loader).__name__} over {type(getattr(loader, 'dataset', None)).__name__}"
            )
        self.num_examples = len(loader.dataset)
        self.sample_rate = self._rate(loader, world_size)

    def _build(self, loader: DataLoader, rank: int, world_size: int) -> DataLoader:
        self._measure(loader, world_size)
        self._check_sampler(loader)
        sampler = PoissonBatchSampler(
            self.num_examples, self.sample_rate, seed=self.mask_seed(), rank=rank, world_size=world_size
        )
        self.steps_per_epoch = len(sampler)
        return DataLoader(
            loader.dataset,
            batch_sampler=sampler,
            collate_fn=EmptySafeCollate(loader.dataset, loader.collate_fn),
            num_workers=loader.num_workers,
            pin_memory=loader.pin_memory,
            persistent_workers=loader.persistent_workers,
        )

    def _rate(self, loader: DataLoader, world_size: int) -> float:
        if self.requested_rate is not None:
            return self.requested_rate
        if loader.batch_size is None:
            raise MisconfigurationException(
                "DPCallback cannot infer the sample rate from a loader with a custom batch_sampler: "
                "pass DPCallback(sample_rate=...)"
            )
        rate = loader.batch_size * world_size / self.num_examples
        if rate > 1:
            raise MisconfigurationException(
                f"DPCallback: batch_size {loader.batch_size} x {world_size} device(s) exceeds the {self.num_examples} "
                "training examples (sample rate > 1); lower --data.batch_size"
            )
        return rate

    @staticmethod
    def _check_sampler(loader: DataLoader) -> None:
        custom_sampler = not isinstance(loader.sampler, (RandomSampler, SequentialSampler))
        custom_batches = type(loader.batch_sampler) is not BatchSampler
        if custom_sampler or custom_batches:
            raise MisconfigurationException(
                f"DPCallback: the train loader uses {type(loader.sampler).__name__} / "
                f"{type(loader.batch_sampler).__name__}, which Poisson sampling would silently replace (a weighted "
                "sampler changes the sample rate the accountant assumes); use a plain shuffled loader"
            )


def _check_uniform_shuffle(loader: DataLoader) -> None:
    """With ``poisson_sampling=False`` each example must appear at most once per epoch, in a uniform order."""
    sampler = loader.sampler
    uniform = (
        type(sampler) is RandomSampler
        and not sampler.replacement
        and sampler._num_samples is None
        and type(loader.batch_sampler) is BatchSampler
    )
    if not uniform:
        raise MisconfigurationException(
            f"DPCallback(poisson_sampling=False) needs a uniform shuffle without replacement, but the train loader "
            f"uses {type(sampler).__name__} / {type(loader.batch_sampler).__name__}"
            f"{' with replacement or num_samples' if isinstance(sampler, RandomSampler) else ''}: one example "
            "could then appear several times per batch or epoch. Use DataLoader(..., shuffle=True), or let the "
            "callback Poisson-sample (poisson_sampling=True)"
        )


def _trained_position(trainer: L.Trainer) -> tuple[int, int]:
    """The epoch being trained and how many of its batches a restored checkpoint already trained (0 when fresh)."""
    loop = trainer.fit_loop
    trained = loop.epoch_loop.batch_progress.current.processed if loop.restarting else 0
    return loop.epoch_progress.current.processed, trained
