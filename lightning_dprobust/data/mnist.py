"""MNIST (LeCun, Bottou, Bengio, Haffner 1998) and Fashion-MNIST (Xiao, Rasul, Vollgraf 2017, arXiv 1708.07747).

Both use the idx file format: a big-endian header (magic number ``0x00000800 + ndim`` for unsigned bytes, then one
32-bit size per dimension) followed by the raw bytes. The files are read through torchvision's
:class:`~torchvision.datasets.MNIST` from ``<data_dir>/<MNIST|FashionMNIST>/raw/``.
"""

from __future__ import annotations

import math
import struct
import zlib
from pathlib import Path

from torchvision.datasets import MNIST, FashionMNIST
from torchvision.datasets import utils as tv_utils

from lightning_dprobust.data.files import DatasetSource
from lightning_dprobust.data.vision import VisionDataModule

IDX_UBYTE_MAGIC = 0x0800
IMAGE_SIDE = 28


def _layout(folder: str) -> str:
    return (
        f"{{root}}/{folder}/raw/ holds train-images-idx3-ubyte, train-labels-idx1-ubyte, t10k-images-idx3-ubyte "
        "and t10k-labels-idx1-ubyte, or the same names with .gz (the official archives, MD5-checked then extracted)"
    )


class MNISTDataModule(VisionDataModule):
    """MNIST: 28x28 grayscale digits, 60,000 train and 10,000 test images, 10 classes.

    Images are ``float32`` in ``[0, 1]`` of shape ``(1, 28, 28)``; labels ``int64`` in ``0..9``. The official test
    set is the test split; ``val_fraction`` of the official train set (seeded) is the validation split.

    Integrity: ``.gz`` archives found without their extracted file are checked against torchvision's published
    MD5 sums and extracted. Every extracted idx file must start with the unsigned-byte magic number for its rank,
    have 28x28 images, have exactly the size its header announces (so a truncated file is caught) and the images
    and labels of a split must be equally many.

    Args:
        **kwargs: see :class:`~lightning_dprobust.data.vision.VisionDataModule`.

    Example:
        >>> MNISTDataModule.input_shape, MNISTDataModule.num_classes
        ((1, 28, 28), 10)
    """

    name = "mnist"
    num_classes = 10
    input_shape = (1, IMAGE_SIDE, IMAGE_SIDE)
    mean = (0.1307,)
    std = (0.3081,)
    dataset_cls = MNIST
    folder = "MNIST/raw"
    source = DatasetSource(
        title="MNIST",
        name="mnist",
        url="https://ossci-datasets.s3.amazonaws.com/mnist/ (mirror of http://yann.lecun.com/exdb/mnist/)",
        layout=_layout("MNIST"),
        downloadable=True,
    )

    def check_files(self) -> None:
        """Extract MD5-verified archives where needed, then check every idx file's header and size."""
        raw = self.data_dir / self.folder
        self._extract_archives(raw)
        for split in ("train", "t10k"):
            images = self._idx_count(raw / f"{split}-images-idx3-ubyte", ndim=3)
            labels = self._idx_count(raw / f"{split}-labels-idx1-ubyte", ndim=1)
            if images != labels:
                raise self.source.corrupt(
                    self.data_dir, raw / f"{split}-labels-idx1-ubyte", f"{labels} labels for {images} images"
                )

    def _extract_archives(self, raw: Path) -> None:
        names = [(name.removesuffix(".gz"), name, md5) for name, md5 in self.dataset_cls.resources]
        absent = [
            f"{self.folder}/{plain} (or {archive})"
            for plain, archive, _ in names
            if not (raw / plain).exists() and not (raw / archive).exists()
        ]
        if absent:
            raise self.source.missing(self.data_dir, absent)
        for plain, archive, md5 in names:
            if (raw / plain).exists():
                continue
            if not tv_utils.check_integrity(str(raw / archive), md5):
                raise self.source.corrupt(self.data_dir, raw / archive, f"its MD5 sum differs from the published {md5}")
            try:
                tv_utils.extract_archive(str(raw / archive), str(raw))
            except (EOFError, OSError, zlib.error) as err:
                (raw / plain).unlink(missing_ok=True)
                raise self.source.corrupt(self.data_dir, raw / archive, f"cannot decompress it ({err})") from err

    def _idx_count(self, path: Path, ndim: int) -> int:
        """Number of items in an unsigned-byte idx file after checking its magic number, shape and size."""
        header_size = 4 * (1 + ndim)
        with path.open("rb") as file:
            header = file.read(header_size)
        if len(header) < header_size:
            raise self.source.corrupt(self.data_dir, path, f"only {len(header)} bytes, shorter than its idx header")
        magic, *dims = struct.unpack(f">{1 + ndim}I", header)
        if magic != IDX_UBYTE_MAGIC + ndim:
            raise self.source.corrupt(
                self.data_dir, path, f"magic number {magic:#010x}, expected {IDX_UBYTE_MAGIC + ndim:#010x}"
            )
        if dims[1:] != [IMAGE_SIDE] * (ndim - 1):
            raise self.source.corrupt(self.data_dir, path, f"items of shape {dims[1:]}, expected 28x28")
        expected, actual = header_size + math.prod(dims), path.stat().st_size
        if actual != expected:
            raise self.source.corrupt(
                self.data_dir, path, f"{actual} bytes but its header announces {expected}: truncated or damaged"
            )
        return dims[0]


class FashionMNISTDataModule(MNISTDataModule):
    """Fashion-MNIST: 28x28 grayscale clothing images in MNIST's format and sizes, 10 classes.

    Read from ``<data_dir>/FashionMNIST/raw/`` with the same checks as :class:`MNISTDataModule`.

    Example:
        >>> FashionMNISTDataModule.input_shape, FashionMNISTDataModule.num_classes
        ((1, 28, 28), 10)
    """

    name = "fashion_mnist"
    mean = (0.2860,)
    std = (0.3530,)
    dataset_cls = FashionMNIST
    folder = "FashionMNIST/raw"
    source = DatasetSource(
        title="Fashion-MNIST",
        name="fashion_mnist",
        url="https://github.com/zalandoresearch/fashion-mnist (files at "
        "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/)",
        layout=_layout("FashionMNIST"),
        downloadable=True,
    )
