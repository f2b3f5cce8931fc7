"""Base of the data modules whose whole dataset fits in memory as arrays and ships with an installed package."""

from __future__ import annotations

import numpy as np
import torch
from torch.utils.data import TensorDataset

from lightning_dprobust.data.base import ImageDataModule
from lightning_dprobust.data.splits import check_fraction, stratified_split_indices


class EmbeddedDataModule(ImageDataModule):
    """An in-memory dataset split into train/val/test, stratified by class, as a deterministic function of ``seed``.

    Subclasses implement :meth:`load_arrays`. The splits are :class:`~torch.utils.data.TensorDataset` objects, so
    ``test_set.tensors`` gives the test images and labels at once.

    Args:
        test_fraction: fraction of all images held out as the test split.
        val_fraction: fraction of the remaining images held out for validation.
        **kwargs: see :class:`~lightning_dprobust.data.base.ImageDataModule`.
    """

    def __init__(self, test_fraction: float = 0.2, val_fraction: float = 0.1, **kwargs) -> None:
        super().__init__(**kwargs)
        check_fraction("test_fraction", test_fraction)
        check_fraction("val_fraction", val_fraction)
        self.test_fraction = test_fraction
        self.val_fraction = val_fraction

    def load_arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """All images as ``float32`` of shape ``(N, *input_shape)`` in ``[0, 1]``, and their ``int64`` labels."""
        raise NotImplementedError

    def setup(self, stage: str | None = None) -> None:
        if self.train_set is not None:
            return
        images, labels = self.load_arrays()
        train, val, test = stratified_split_indices(labels, self.test_fraction, self.val_fraction, self.seed)
        x, y = torch.from_numpy(images), torch.from_numpy(labels)
        self.train_set = TensorDataset(x[train], y[train])
        self.val_set = TensorDataset(x[val], y[val])
        self.test_set = TensorDataset(x[test], y[test])
