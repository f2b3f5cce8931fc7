"""CelebA (Liu, Luo, Wang, Tang 2015, "Deep Learning Face Attributes in the Wild", arXiv 1411.7766)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch
from torchvision import transforms
from torchvision.datasets import CelebA
from typing_extensions import override

from lightning_dprobust.data.base import ImageDataModule
from lightning_dprobust.data.files import DatasetSource
from lightning_dprobust.data.images import ImageFiles

SIDE = 64
IMAGES = "img_align_celeba"
ATTR_FILE = "list_attr_celeba.txt"
PARTITION_FILE = "list_eval_partition.txt"
ATTRIBUTES = (
    "5_o_Clock_Shadow Arched_Eyebrows Attractive Bags_Under_Eyes Bald Bangs Big_Lips Big_Nose Black_Hair Blond_Hair "
    "Blurry Brown_Hair Bushy_Eyebrows Chubby Double_Chin Eyeglasses Goatee Gray_Hair Heavy_Makeup High_Cheekbones "
    "Male Mouth_Slightly_Open Mustache Narrow_Eyes No_Beard Oval_Face Pale_Skin Pointy_Nose Receding_Hairline "
    "Rosy_Cheeks Sideburns Smiling Straight_Hair Wavy_Hair Wearing_Earrings Wearing_Hat Wearing_Lipstick "
    "Wearing_Necklace Wearing_Necktie Young"
).split()
SPLITS = {"train": 0, "val": 1, "test": 2}


class CelebADataModule(ImageDataModule):
    """CelebA aligned faces with their 40 binary attributes, in the official train/val/test partition.

    Images are resized (shorter side) and center-cropped to 64x64, as DP-Adv does (Bu, Li, Zhao, "Practical
    Adversarial Training with Differential Privacy for Deep Learning", ICLR 2022 submission, OpenReview
    1hw-h1C8bch, section 4.6), giving ``float32`` tensors in ``[0, 1]`` of shape ``(3, 64, 64)``. The split is
    ``list_eval_partition.txt`` (0 train, 1 val, 2 test: 162,770 / 19,867 / 19,962 images); DP-Adv's random
    180,000 / 20,000 split is not reproduced, since the paper gives neither its seed nor its exact size.
    ``mean``/``std`` are 0.5 per channel, since the paper gives none.

    Targets: by default the 40 attributes as a ``float32`` vector in ``{0, 1}`` (the file's -1 becomes 0; order of
    ``ATTRIBUTES``) and ``num_classes`` is 40 with ``multilabel`` true. With ``target_attribute`` the target is that
    attribute alone as an ``int64`` class index (1 = attribute present) and ``num_classes`` is 2.

    Integrity: both text files must match torchvision's published MD5 sums and agree with each other, and every
    listed image must exist. An image that cannot be decoded raises ``DatasetNotFoundError`` when read.

    Args:
        target_attribute: one of ``ATTRIBUTES`` to train a binary classifier on, or ``None`` for all 40.
        **kwargs: see :class:`~lightning_dprobust.data.base.ImageDataModule`.

    Example:
        >>> CelebADataModule(target_attribute="Smiling").num_classes
        2
    """

    name = "celeba"
    num_classes = len(ATTRIBUTES)
    input_shape = (3, SIDE, SIDE)
    mean = (0.5, 0.5, 0.5)
    std = (0.5, 0.5, 0.5)
    source = DatasetSource(
        title="CelebA",
        name="celeba",
        url="https://mmlab.ie.cuhk.edu.hk/projects/CelebA.html (Align&Cropped images and Anno/Eval text files)",
        layout=f"{{root}} holds {IMAGES}/*.jpg (unzip img_align_celeba.zip), {ATTR_FILE} and {PARTITION_FILE}",
    )

    def __init__(self, target_attribute: str | None = None, **kwargs) -> None:
        super().__init__(**kwargs)
        if target_attribute is not None and target_attribute not in ATTRIBUTES:
            raise ValueError(
                f"unknown CelebA attribute {target_attribute!r}: set --data.target_attribute to one of "
                f"{', '.join(ATTRIBUTES)}, or null for all 40"
            )
        self.target_attribute = target_attribute
        self.multilabel = target_attribute is None
        self.num_classes = len(ATTRIBUTES) if self.multilabel else 2

    @override
    def setup(self, stage: str | None = None) -> None:
        if self.train_set is not None:
            return
        md5 = {filename: checksum for _, checksum, filename in CelebA.file_list}
        self.source.require(self.data_dir, [IMAGES, ATTR_FILE, PARTITION_FILE])
        self.source.require_md5(self.data_dir, [(ATTR_FILE, md5[ATTR_FILE]), (PARTITION_FILE, md5[PARTITION_FILE])])
        names, present = self._read_attributes(self.data_dir / ATTR_FILE)
        partition = self._read_partition(self.data_dir / PARTITION_FILE, names)
        self._require_images(names)
        if self.multilabel:
            targets = present.float()
        else:
            targets = present[:, ATTRIBUTES.index(self.target_attribute)].long()
        prepare = transforms.Compose([transforms.Resize(SIDE), transforms.CenterCrop(SIDE)])
        paths = np.array([str(self.data_dir / IMAGES / name) for name in names], dtype=object)
        splits = {}
        for split, code in SPLITS.items():
            keep = partition == code
            splits[split] = ImageFiles(
                paths[keep].tolist(), targets[torch.from_numpy(keep)], (SIDE, SIDE), self.source, self.data_dir, prepare
            )
        self.train_set, self.val_set, self.test_set = splits["train"], splits["val"], splits["test"]

    def _read_attributes(self, path: Path) -> tuple[list[str], torch.Tensor]:
        """Image names and a boolean ``(N, 40)`` attribute matrix; checks header, row count and values."""
        lines = path.read_text().splitlines()
        if len(lines) < 2 or lines[1].split() != ATTRIBUTES:
            raise self.source.corrupt(self.data_dir, path, "its second line is not the 40 CelebA attribute names")
        rows = [line for line in lines[2:] if line.strip()]
        if not rows or lines[0].strip() != str(len(rows)):
            raise self.source.corrupt(
                self.data_dir, path, f"header announces {lines[0].strip()} rows, found {len(rows)}"
            )
        try:
            values = np.loadtxt(rows, dtype=np.int64, usecols=range(1, len(ATTRIBUTES) + 1), ndmin=2)
        except ValueError as err:
            raise self.source.corrupt(self.data_dir, path, f"cannot parse the attribute rows ({err})") from err
        if not np.isin(values, (-1, 1)).all():
            raise self.source.corrupt(self.data_dir, path, "attribute values must be -1 or 1")
        return [row.split(maxsplit=1)[0] for row in rows], torch.from_numpy(values == 1)

    def _read_partition(self, path: Path, names: list[str]) -> np.ndarray:
        """The split code (0 train, 1 val, 2 test) of each image, checked against the attribute file's names."""
        rows = [line.split() for line in path.read_text().splitlines() if line.strip()]
        if [row[0] for row in rows] != names or any(len(row) != 2 for row in rows):
            raise self.source.corrupt(
                self.data_dir, path, f"its image names do not match the {len(names)} rows of {ATTR_FILE}"
            )
        codes = np.array([row[1] for row in rows])
        if not np.isin(codes, ("0", "1", "2")).all():
            raise self.source.corrupt(self.data_dir, path, "partition codes must be 0, 1 or 2")
        return codes.astype(np.int64)

    def _require_images(self, names: list[str]) -> None:
        present = set(os.listdir(self.data_dir / IMAGES))
        absent = [f"{IMAGES}/{name}" for name in names if name not in present]
        if absent:
            raise self.source.missing(self.data_dir, absent)
