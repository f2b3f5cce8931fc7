"""Base for the data modules that read their files through a torchvision dataset class (MNIST, CIFAR-10)."""

from __future__ import annotations

import pickle

import numpy as np
import torch
from torch.utils.data import Subset
from torchvision.datasets import VisionDataset
from torchvision.transforms import ToTensor
from typing_extensions import override

from lightning_dprobust.data.base import ImageDataModule
from lightning_dprobust.data.files import DatasetSource
from lightning_dprobust.data.splits import (
    TrainPart,
    check_fraction,
    check_train_part,
    split_dataset,
    train_part_indices,
)

LOAD_ERRORS = (RuntimeError, ValueError, TypeError, KeyError, EOFError, OSError, pickle.UnpicklingError)


class VisionDataModule(ImageDataModule):
    """A torchvision dataset's official train set split into train/val by ``seed``, and its test set.

    Subclasses set ``dataset_cls`` (a torchvision class taking ``root, train, transform, download``), ``source``,
    ``folder`` (where the files lie under ``data_dir``) and implement :meth:`check_files`. Images come out of
    ``ToTensor`` as ``float32`` in ``[0, 1]``; labels are ``int64`` class indices.

    Args:
        download: let torchvision download the files into ``data_dir`` when they are missing (in ``prepare_data``,
            on one process). A failed download raises ``DatasetNotFoundError``.
        val_fraction: fraction of the official training set held out for validation (``0`` for none).
        train_part: ``"all"`` (default): the train split; ``"public"`` or ``"private"``: one of two disjoint halves
            of it, stratified by class (:func:`~lightning_dprobust.data.splits.train_part_indices`, by ``seed``);
            validation and test splits unchanged. Components pre-trained on the public half (a classifier in front
            of a DP denoiser) then never saw the private half a DP model trains on.
        **kwargs: see :class:`~lightning_dprobust.data.base.ImageDataModule`.

    Raises:
        DatasetNotFoundError: in ``setup`` when a file is missing, truncated or fails its MD5 check.
    """

    dataset_cls: type[VisionDataset]
    source: DatasetSource
    folder: str = ""

    def __init__(
        self,
        download: bool = False,
        val_fraction: float = 0.1,
        train_part: TrainPart = "all",
        **kwargs,
    ) -> None:
        super().__init__(**kwargs)
        check_fraction("val_fraction", val_fraction, allow_zero=True)
        self.download = download
        self.val_fraction = val_fraction
        self.train_part = check_train_part(train_part)

    def check_files(self) -> None:
        """Raise ``DatasetNotFoundError`` unless every file exists and passes its integrity check."""
        raise NotImplementedError

    @override
    def prepare_data(self) -> None:
        if not self.download:
            return
        self.data_dir.mkdir(parents=True, exist_ok=True)
        try:
            self.dataset_cls(str(self.data_dir), train=False, download=True)
        except (RuntimeError, OSError) as err:
            raise self.source.download_failed(self.data_dir, err) from err

    @override
    def setup(self, stage: str | None = None) -> None:
        if self.train_set is not None:
            return
        self.check_files()
        train, test = self._load(train=True), self._load(train=False)
        self.train_set, self.val_set = split_dataset(train, self.val_fraction, self.seed)
        if self.train_part != "all":
            indices = np.asarray(self.train_set.indices)
            labels = np.asarray(train.targets)[indices]
            self.train_set = Subset(train, indices[train_part_indices(labels, self.train_part, self.seed)].tolist())
        self.test_set = test

    def _load(self, train: bool) -> VisionDataset:
        try:
            dataset = self.dataset_cls(str(self.data_dir), train=train, transform=ToTensor())
        except LOAD_ERRORS as err:
            raise self.source.corrupt(
                self.data_dir, self.data_dir / self.folder, f"{type(err).__name__}: {err}"
            ) from err
        labels = torch.as_tensor(dataset.targets)
        if len(labels) == 0 or labels.min() < 0 or labels.max() >= self.num_classes:
            raise self.source.corrupt(
                self.data_dir, self.data_dir / self.folder, f"labels must be class indices in [0, {self.num_classes})"
            )
        return dataset
