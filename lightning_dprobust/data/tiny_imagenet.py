"""Tiny ImageNet (Le and Yang 2015, "Tiny ImageNet Visual Recognition Challenge", Stanford CS231N)."""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

import torch
from typing_extensions import override

from lightning_dprobust.data.base import ImageDataModule
from lightning_dprobust.data.files import DatasetSource, list_names
from lightning_dprobust.data.images import ImageFiles
from lightning_dprobust.data.splits import check_fraction, split_dataset

FOLDER = "tiny-imagenet-200"
SIDE = 64


def _jpegs(folder: Path) -> list[str]:
    return sorted(entry.path for entry in os.scandir(folder) if entry.name.endswith(".JPEG"))


class TinyImageNetDataModule(ImageDataModule):
    """Tiny ImageNet: 64x64 colour images of 200 classes, 500 train and 50 val images per class.

    Reads the official ``tiny-imagenet-200`` folder. The official validation images (labelled in
    ``val/val_annotations.txt``) are the test split, since the official test images have no labels;
    ``val_fraction`` of the training images (seeded) is the validation split. Class ``k`` is line ``k`` of
    ``wnids.txt``; after ``setup`` ``classes`` holds those WordNet ids and ``num_classes`` their number.
    Images are ``float32`` in ``[0, 1]`` of shape ``(3, 64, 64)`` (grayscale files get three equal channels);
    labels are ``int64``. ``mean``/``std`` are the commonly used training-set statistics.

    Integrity: no checksums are published, so every class folder must hold ``train_per_class`` images, every
    annotated validation file must exist with a known WordNet id and each class must have ``val_per_class`` of them.
    A file that cannot be decoded raises ``DatasetNotFoundError`` naming it when it is read.

    Args:
        val_fraction: fraction of the training images held out for validation (``0`` for none).
        **kwargs: see :class:`~lightning_dprobust.data.base.ImageDataModule`.

    Example:
        >>> TinyImageNetDataModule.input_shape, TinyImageNetDataModule.num_classes
        ((3, 64, 64), 200)
    """

    name = "tiny_imagenet"
    num_classes = 200
    input_shape = (3, SIDE, SIDE)
    mean = (0.4802, 0.4481, 0.3975)
    std = (0.2302, 0.2265, 0.2262)
    train_per_class = 500
    val_per_class = 50
    source = DatasetSource(
        title="Tiny ImageNet",
        name="tiny_imagenet",
        url="http://cs231n.stanford.edu/tiny-imagenet-200.zip",
        layout=f"{{root}}/{FOLDER}/ holds wnids.txt, train/<wnid>/images/*.JPEG, val/images/*.JPEG and "
        "val/val_annotations.txt (unzip tiny-imagenet-200.zip in {root})",
    )

    def __init__(self, val_fraction: float = 0.1, **kwargs) -> None:
        super().__init__(**kwargs)
        check_fraction("val_fraction", val_fraction, allow_zero=True)
        self.val_fraction = val_fraction
        self.classes: list[str] = []

    @override
    def setup(self, stage: str | None = None) -> None:
        if self.train_set is not None:
            return
        names = ["wnids.txt", "train", "val/images", "val/val_annotations.txt"]
        self.source.require(self.data_dir, [f"{FOLDER}/{name}" for name in names])
        root = self.data_dir / FOLDER
        wnids = (root / "wnids.txt").read_text().split()
        train_paths, train_labels = self._train_files(root, wnids)
        test_paths, test_labels = self._val_files(root, wnids)
        self.classes, self.num_classes = wnids, len(wnids)
        full = self._images(train_paths, train_labels)
        self.train_set, self.val_set = split_dataset(full, self.val_fraction, self.seed)
        self.test_set = self._images(test_paths, test_labels)

    def _images(self, paths: list[str], labels: list[int]) -> ImageFiles:
        targets = torch.tensor(labels, dtype=torch.int64)
        return ImageFiles(paths, targets, (SIDE, SIDE), self.source, self.data_dir)

    def _train_files(self, root: Path, wnids: list[str]) -> tuple[list[str], list[int]]:
        absent = [f"{FOLDER}/train/{wnid}/images" for wnid in wnids if not (root / "train" / wnid / "images").is_dir()]
        if absent:
            raise self.source.missing(self.data_dir, absent)
        paths, labels = [], []
        for label, wnid in enumerate(wnids):
            files = _jpegs(root / "train" / wnid / "images")
            if len(files) != self.train_per_class:
                raise self.source.corrupt(
                    self.data_dir, root / "train" / wnid / "images", f"{len(files)} of {self.train_per_class} images"
                )
            paths += files
            labels += [label] * len(files)
        return paths, labels

    def _val_files(self, root: Path, wnids: list[str]) -> tuple[list[str], list[int]]:
        annotations = root / "val" / "val_annotations.txt"
        index = {wnid: label for label, wnid in enumerate(wnids)}
        rows = [line.split("\t")[:2] for line in annotations.read_text().splitlines() if line.strip()]
        unknown = sorted({row[-1] for row in rows if len(row) < 2 or row[1] not in index})
        if unknown:
            raise self.source.corrupt(
                self.data_dir, annotations, f"WordNet ids not in wnids.txt: {list_names(unknown)}"
            )
        present = set(os.listdir(root / "val" / "images"))
        absent = [f"{FOLDER}/val/images/{name}" for name, _ in rows if name not in present]
        if absent:
            raise self.source.missing(self.data_dir, absent)
        counts = Counter(wnid for _, wnid in rows)
        short = [f"{wnid}: {counts[wnid]}" for wnid in wnids if counts[wnid] != self.val_per_class]
        if short:
            raise self.source.corrupt(
                self.data_dir, annotations, f"expected {self.val_per_class} images per class, found {list_names(short)}"
            )
        return [str(root / "val" / "images" / name) for name, _ in rows], [index[wnid] for _, wnid in rows]
