"""CIFAR-10 (Krizhevsky 2009, "Learning Multiple Layers of Features from Tiny Images"), python version."""

from __future__ import annotations

from torchvision.datasets import CIFAR10

from lightning_dprobust.data.files import DatasetSource
from lightning_dprobust.data.vision import VisionDataModule


class CIFAR10DataModule(VisionDataModule):
    """CIFAR-10: 32x32 colour images, 50,000 train and 10,000 test, 10 classes.

    Read through torchvision's :class:`~torchvision.datasets.CIFAR10` from the pickled batches in
    ``<data_dir>/cifar-10-batches-py/``. Images are ``float32`` in ``[0, 1]`` of shape ``(3, 32, 32)``; labels
    ``int64`` in ``0..9``. The official test batch is the test split; ``val_fraction`` of the five training batches
    (seeded) is the validation split. ``mean``/``std`` are the per-channel training-set statistics.

    Integrity: every batch and ``batches.meta`` must exist and match torchvision's published MD5 sums.

    Args:
        **kwargs: see :class:`~lightning_dprobust.data.vision.VisionDataModule`.

    Example:
        >>> CIFAR10DataModule.input_shape, CIFAR10DataModule.num_classes
        ((3, 32, 32), 10)
    """

    name = "cifar10"
    num_classes = 10
    input_shape = (3, 32, 32)
    mean = (0.4914, 0.4822, 0.4465)
    std = (0.2470, 0.2435, 0.2616)
    dataset_cls = CIFAR10
    folder = CIFAR10.base_folder
    source = DatasetSource(
        title="CIFAR-10",
        name="cifar10",
        url="https://www.cs.toronto.edu/~kriz/cifar.html (cifar-10-python.tar.gz)",
        layout="{root}/cifar-10-batches-py/ holds data_batch_1 ... data_batch_5, test_batch and batches.meta "
        "(extract cifar-10-python.tar.gz in {root})",
        downloadable=True,
    )

    def check_files(self) -> None:
        """Check that every batch and the meta file exist and match their published MD5 sums."""
        cls = self.dataset_cls
        files = [*cls.train_list, *cls.test_list, (cls.meta["filename"], cls.meta["md5"])]
        self.source.require_md5(self.data_dir, [(f"{self.folder}/{name}", md5) for name, md5 in files])
