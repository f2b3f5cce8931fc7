"""Invasive ductal carcinoma (IDC) breast histopathology patches (Cruz-Roa et al. 2014, SPIE Medical Imaging;
Janowczyk and Madabhushi 2016, J. Pathol. Inform. 7:29), as used by residual perturbation (Tao, Ling, Shi, Wang,
"Deep Learning with Data Privacy via Residual Perturbation", arXiv 2408.05723)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from typing_extensions import override

from lightning_dprobust.data.base import ImageDataModule
from lightning_dprobust.data.files import DatasetSource
from lightning_dprobust.data.images import ImageFiles
from lightning_dprobust.data.splits import split_groups

PATCH = 50
WHITE = (255, 255, 255)
PATIENT_FILES = ["<patient_id>/0/*.png", "<patient_id>/1/*.png"]
CLASSES = ("no invasive ductal carcinoma", "invasive ductal carcinoma")


def pad_patch(image: Image.Image) -> Image.Image:
    """Pad a patch cut short by a slide border to 50x50 with white (slide background) on the right and bottom.

    Patches at least 50 pixels wide and high are returned unchanged.
    """
    width, height = image.size
    if width >= PATCH and height >= PATCH:
        return image
    canvas = Image.new("RGB", (max(width, PATCH), max(height, PATCH)), WHITE)
    canvas.paste(image, (0, 0))
    return canvas


class IDCDataModule(ImageDataModule):
    """IDC: 277,524 RGB 50x50 patches from 279 patients' slides, label 1 for invasive ductal carcinoma.

    Reads ``<data_dir>/<patient_id>/<0|1>/*.png`` (the Kaggle "Breast Histopathology Images" layout; other folders
    are ignored). Images are ``float32`` in ``[0, 1]`` of shape ``(3, 50, 50)``; labels ``int64`` in ``{0, 1}``.
    Patches smaller than 50x50 (cut at slide borders) are padded with white on the right and bottom, so every patch
    is kept and the counts match the paper's. ``mean``/``std`` are 0.5 per channel (no published statistics).

    The split is by patient: no patient is in two splits. Patients are visited in a seeded random order and go
    whole to the test split until it holds ``test_size`` patches, then to the train split until it holds
    ``train_size``; the remaining patients form the validation split (residual perturbation, spec section 2.1:
    39,952 train, 43,420 test, the rest validation). Each split therefore exceeds its size by less than one
    patient's patches. After ``setup`` ``patients`` maps each split to its patient ids.

    Integrity: no checksums are published. With integer sizes (the paper's split) the folder must hold all
    ``total_patches`` patches; with fractions any number is accepted. An image that cannot be decoded or is larger
    than 50x50 raises ``DatasetNotFoundError`` naming it when it is read. A folder without any patch of one class
    raises ``DatasetNotFoundError``, and a train split without one (too few patients of that class in a subset) a
    ``ValueError``: a model trained on one class learns a constant.

    Args:
        train_size: patches in the train split, as a count (int) or a fraction of all patches (float in (0, 1)).
        test_size: patches in the test split, of the same kind as ``train_size``.
        **kwargs: see :class:`~lightning_dprobust.data.base.ImageDataModule`.

    Example:
        >>> IDCDataModule.input_shape, IDCDataModule.num_classes
        ((3, 50, 50), 2)
    """

    name = "idc"
    num_classes = 2
    input_shape = (3, PATCH, PATCH)
    mean = (0.5, 0.5, 0.5)
    std = (0.5, 0.5, 0.5)
    total_patches = 277_524
    source = DatasetSource(
        title="IDC breast histopathology",
        name="idc",
        url="https://www.kaggle.com/datasets/paultimothymooney/breast-histopathology-images (originally "
        "http://andrewjanowczyk.com/use-case-6-invasive-ductal-carcinoma-idc-segmentation/)",
        layout="{root}/<patient_id>/0/*.png and {root}/<patient_id>/1/*.png, one folder per patient",
    )

    def __init__(self, train_size: int | float = 39_952, test_size: int | float = 43_420, **kwargs) -> None:
        super().__init__(**kwargs)
        counts = all(isinstance(size, int) and size >= 1 for size in (train_size, test_size))
        fractions = all(isinstance(size, float) and 0.0 < size < 1.0 for size in (train_size, test_size))
        if not (counts or (fractions and train_size + test_size < 1.0)):
            raise ValueError(
                f"train_size={train_size!r} and test_size={test_size!r} must both be patch counts (int >= 1) or both "
                "fractions in (0, 1) summing below 1: e.g. --data.train_size 0.144 --data.test_size 0.156"
            )
        self.train_size = train_size
        self.test_size = test_size
        self.patients: dict[str, list[str]] = {}

    @override
    def setup(self, stage: str | None = None) -> None:
        if self.train_set is not None:
            return
        paths, labels, patients = self._scan()
        for label in (0, 1):
            if not (labels == label).any():
                raise self.source.incomplete(
                    self.data_dir,
                    f"found no patch of class {label} ({CLASSES[label]}, <patient_id>/{label}/*.png) among its "
                    f"{len(paths)} patches of {len(set(patients.tolist()))} patients: a model trained on one class "
                    "learns a constant. Put each patient's 0/ and 1/ folders in place",
                )
        test, train, val = split_groups(patients, self._targets(len(paths)), self.seed)
        absent = sorted(set(range(self.num_classes)) - set(labels[train].tolist()))
        if absent:
            raise ValueError(
                f"the train split of {self.data_dir} ({len(train)} patches of {len(set(patients[train].tolist()))} "
                f"patients) holds no patch of class {absent[0]} ({CLASSES[absent[0]]}): too few patients of that "
                "class for a split by patient. Use more of the dataset (a larger --data.train_size, more patients) "
                "or another --data.seed"
            )
        sets = {}
        for split, index in (("train", train), ("val", val), ("test", test)):
            targets = torch.from_numpy(labels[index])
            sets[split] = ImageFiles(
                paths[index].tolist(), targets, (PATCH, PATCH), self.source, self.data_dir, pad_patch
            )
            self.patients[split] = sorted(set(patients[index].tolist()))
        self.train_set, self.val_set, self.test_set = sets["train"], sets["val"], sets["test"]

    def _targets(self, total: int) -> list[int]:
        """Patch targets of the test and train splits."""
        if isinstance(self.train_size, float):
            return [round(self.test_size * total), round(self.train_size * total)]
        if total != self.total_patches:
            raise self.source.incomplete(
                self.data_dir,
                f"found {total} patches but the official release has {self.total_patches}, which the patch counts "
                f"train_size={self.train_size}, test_size={self.test_size} assume; give fractions instead "
                "(e.g. --data.train_size 0.144 --data.test_size 0.156) to split a subset",
            )
        return [self.test_size, self.train_size]

    def _scan(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Paths, labels and patient ids of every patch, in sorted (patient, label, file name) order."""
        if not self.data_dir.is_dir():
            raise self.source.missing(self.data_dir, PATIENT_FILES)
        paths, labels, patients = [], [], []
        folders = sorted(Path(entry.path) for entry in os.scandir(self.data_dir) if entry.is_dir())
        for folder in folders:
            for label in (0, 1):
                if not (folder / str(label)).is_dir():
                    continue
                files = sorted(entry.path for entry in os.scandir(folder / str(label)) if entry.name.endswith(".png"))
                paths += files
                labels += [label] * len(files)
                patients += [folder.name] * len(files)
        if not paths:
            raise self.source.missing(self.data_dir, PATIENT_FILES)
        return np.array(paths, dtype=object), np.array(labels, dtype=np.int64), np.array(patients, dtype=object)
