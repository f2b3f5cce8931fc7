"""Shared base for the image data modules.

Contract (docs/design.md, contract 1): every data module yields ``(image, label)`` pairs where ``image`` is an
unnormalized float tensor in ``[0, 1]`` of shape ``input_shape`` and ``label`` is an ``int64`` class index (or a
float multi-label vector where the module says so). Normalization is the model's first layer, so attack budgets and
smoothing ``sigma`` are in pixel units everywhere.
"""

from __future__ import annotations

import os
from pathlib import Path

import lightning as L
import torch
from torch.utils.data import DataLoader, Dataset

DATA_ENV = "DPROBUST_DATA"


def resolve_data_dir(data_dir: str | os.PathLike | None, name: str) -> Path:
    """Return ``data_dir`` if given, else ``$DPROBUST_DATA/<name>``, else ``~/.cache/dprobust/data/<name>``."""
    if data_dir is not None:
        return Path(data_dir).expanduser()
    root = os.environ.get(DATA_ENV)
    base = Path(root).expanduser() if root else Path.home() / ".cache" / "dprobust" / "data"
    return base / name


class DatasetNotFoundError(FileNotFoundError):
    """Raised when a dataset's files are missing or incomplete; the message says where and how to get them."""


class ImageDataModule(L.LightningDataModule):
    """Base class: subclasses set ``num_classes``, ``input_shape``, ``mean``, ``std`` and build the three splits.

    Args:
        data_dir: where the dataset files live (``--data.data_dir``; default from ``$DPROBUST_DATA``).
        batch_size: training batch size per device. With ``DPCallback`` this is the *expected* batch size of
            Poisson sampling (sample rate = ``batch_size * world_size / len(train_set)``).
        eval_batch_size: batch size of the validation and test loaders.
        num_workers: data loader worker processes.
        seed: seed of the deterministic train/validation split and of the shuffling generator.
    """

    name: str = ""
    num_classes: int = 0
    input_shape: tuple[int, int, int] = (0, 0, 0)
    mean: tuple[float, ...] = ()
    std: tuple[float, ...] = ()

    def __init__(
        self,
        data_dir: str | None = None,
        batch_size: int = 64,
        eval_batch_size: int = 256,
        num_workers: int = 0,
        seed: int = 0,
    ) -> None:
        super().__init__()
        if batch_size < 1 or eval_batch_size < 1:
            raise ValueError(
                f"batch_size and eval_batch_size must be >= 1, got {batch_size} and {eval_batch_size}: "
                "set --data.batch_size to a positive integer"
            )
        self.data_dir = resolve_data_dir(data_dir, self.name)
        self.batch_size = batch_size
        self.eval_batch_size = eval_batch_size
        self.num_workers = num_workers
        self.seed = seed
        self.train_set: Dataset | None = None
        self.val_set: Dataset | None = None
        self.test_set: Dataset | None = None

    def _require(self, split: Dataset | None, stage: str) -> Dataset:
        if split is None:
            self.setup(stage)
            split = {"fit": self.train_set, "validate": self.val_set, "test": self.test_set}[stage]
        return split

    def train_dataloader(self) -> DataLoader:
        generator = torch.Generator().manual_seed(self.seed)
        return DataLoader(
            self._require(self.train_set, "fit"),
            batch_size=self.batch_size,
            shuffle=True,
            generator=generator,
            num_workers=self.num_workers,
        )

    def val_dataloader(self) -> DataLoader:
        return DataLoader(
            self._require(self.val_set, "validate"), batch_size=self.eval_batch_size, num_workers=self.num_workers
        )

    def test_dataloader(self) -> DataLoader:
        return DataLoader(
            self._require(self.test_set, "test"), batch_size=self.eval_batch_size, num_workers=self.num_workers
        )
