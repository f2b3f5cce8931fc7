"""scikit-learn's bundled handwritten digits: the embedded default dataset (no download needed)."""

from __future__ import annotations

import numpy as np
import torch
from sklearn.datasets import load_digits
from torch.utils.data import TensorDataset

from lightning_dprobust.data.embedded import EmbeddedDataModule
from lightning_dprobust.data.splits import TrainPart, check_train_part, train_part_indices


def load_digits_arrays() -> tuple[np.ndarray, np.ndarray]:
    """All 1,797 digits as ``float32`` images of shape ``(N, 1, 8, 8)`` in ``[0, 1]`` and ``int64`` labels."""
    bunch = load_digits()
    images = (bunch.images / 16.0).astype(np.float32)[:, None, :, :]
    return images, bunch.target.astype(np.int64)


class DigitsDataModule(EmbeddedDataModule):
    """The 8x8 UCI digits (1,797 images, 10 classes) split into train/val/test, stratified by class.

    The split is a deterministic function of ``seed``: with the defaults 1,293 train, 144 val and 360 test images.

    Args:
        test_fraction: fraction of all images held out as the test split.
        val_fraction: fraction of the remaining images held out for validation.
        train_part: ``"all"`` (default): the whole train split; ``"public"`` or ``"private"``: one of two disjoint
            halves of it (:func:`~lightning_dprobust.data.splits.train_part_indices`; 646 and 647 images with the
            defaults), validation and test splits unchanged.
        **kwargs: see :class:`~lightning_dprobust.data.base.ImageDataModule`.
    """

    name = "digits"
    num_classes = 10
    input_shape = (1, 8, 8)
    mean = (0.3063,)
    std = (0.3794,)

    def __init__(self, train_part: TrainPart = "all", **kwargs) -> None:
        super().__init__(**kwargs)
        self.train_part = check_train_part(train_part)

    def load_arrays(self) -> tuple[np.ndarray, np.ndarray]:
        return load_digits_arrays()

    def setup(self, stage: str | None = None) -> None:
        if self.train_set is not None:
            return
        super().setup(stage)
        if self.train_part != "all":
            x, y = self.train_set.tensors
            keep = torch.from_numpy(train_part_indices(y.numpy(), self.train_part, self.seed))
            self.train_set = TensorDataset(x[keep], y[keep])
