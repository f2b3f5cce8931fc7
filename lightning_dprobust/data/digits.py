"""scikit-learn's bundled handwritten digits: the embedded default dataset (no download needed)."""

from __future__ import annotations

import numpy as np
import torch
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch.utils.data import TensorDataset

from lightning_dprobust.data.base import ImageDataModule


def load_digits_arrays() -> tuple[np.ndarray, np.ndarray]:
    """All 1,797 digits as ``float32`` images of shape ``(N, 1, 8, 8)`` in ``[0, 1]`` and ``int64`` labels."""
    bunch = load_digits()
    images = (bunch.images / 16.0).astype(np.float32)[:, None, :, :]
    return images, bunch.target.astype(np.int64)


class DigitsDataModule(ImageDataModule):
    """The 8x8 UCI digits (1,797 images, 10 classes) split into train/val/test, stratified by class.

    The split is a deterministic function of ``seed``: with the defaults 1,293 train, 144 val and 360 test images.

    Args:
        test_fraction: fraction of all images held out as the test split.
        val_fraction: fraction of the remaining images held out for validation.
        **kwargs: see :class:`~lightning_dprobust.data.base.ImageDataModule`.
    """

    name = "digits"
    num_classes = 10
    input_shape = (1, 8, 8)
    mean = (0.3063,)
    std = (0.3794,)

    def __init__(self, test_fraction: float = 0.2, val_fraction: float = 0.1, **kwargs) -> None:
        super().__init__(**kwargs)
        for key, value in (("test_fraction", test_fraction), ("val_fraction", val_fraction)):
            if not 0.0 < value < 1.0:
                raise ValueError(f"{key} must lie in (0, 1), got {value}: set --data.{key} to e.g. 0.2")
        self.test_fraction = test_fraction
        self.val_fraction = val_fraction

    def setup(self, stage: str | None = None) -> None:
        if self.train_set is not None:
            return
        images, labels = load_digits_arrays()
        index = np.arange(len(labels))
        rest, test = train_test_split(index, test_size=self.test_fraction, stratify=labels, random_state=self.seed)
        train, val = train_test_split(rest, test_size=self.val_fraction, stratify=labels[rest], random_state=self.seed)
        x, y = torch.from_numpy(images), torch.from_numpy(labels)
        self.train_set = TensorDataset(x[train], y[train])
        self.val_set = TensorDataset(x[val], y[val])
        self.test_set = TensorDataset(x[test], y[test])
