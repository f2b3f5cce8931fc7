"""CIFAR-100 (Krizhevsky 2009, "Learning Multiple Layers of Features from Tiny Images"), python version."""

from __future__ import annotations

from torchvision.datasets import CIFAR100

from lightning_dprobust.data.cifar10 import CIFAR10DataModule
from lightning_dprobust.data.files import DatasetSource


class CIFAR100DataModule(CIFAR10DataModule):
    """CIFAR-100: 32x32 colour images, 50,000 train and 10,000 test, 100 fine classes.

    Read through torchvision's :class:`~torchvision.datasets.CIFAR100` from the pickles ``train``, ``test`` and
    ``meta`` in ``<data_dir>/cifar-100-python/``; labels are the fine labels, ``int64`` in ``0..99``. Splits,
    ``[0, 1]`` images and the MD5 check of every file are those of :class:`CIFAR10DataModule`. ``mean``/``std`` are
    the per-channel training-set statistics.

    Example:
        >>> CIFAR100DataModule.input_shape, CIFAR100DataModule.num_classes
        ((3, 32, 32), 100)
    """

    name = "cifar100"
    num_classes = 100
    mean = (0.5071, 0.4865, 0.4409)
    std = (0.2673, 0.2564, 0.2762)
    dataset_cls = CIFAR100
    folder = CIFAR100.base_folder
    source = DatasetSource(
        title="CIFAR-100",
        name="cifar100",
        url="https://www.cs.toronto.edu/~kriz/cifar.html (cifar-100-python.tar.gz)",
        layout="{root}/cifar-100-python/ holds train, test and meta (extract cifar-100-python.tar.gz in {root})",
        downloadable=True,
    )
