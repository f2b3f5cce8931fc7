"""A dataset of image files decoded on access, for the folder-based datasets (Tiny ImageNet, CelebA, IDC)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import torch
from PIL import Image
from torch.utils.data import Dataset
from torchvision.transforms.functional import to_tensor

from lightning_dprobust.data.files import DatasetSource


class ImageFiles(Dataset):
    """``(image, target)`` pairs read from image files: ``image`` is a ``float32`` RGB tensor in ``[0, 1]``.

    Each file is decoded with PIL and converted to RGB (grayscale files get three equal channels), passed through
    ``prepare`` if given, and must then measure ``size``. A file that cannot be decoded (truncated, damaged) or
    has the wrong size raises :class:`~lightning_dprobust.data.base.DatasetNotFoundError` naming it.

    Args:
        paths: the image files.
        targets: one target per file: ``int64`` class indices of shape ``(N,)`` or a float ``(N, K)`` multi-label
            matrix.
        size: the ``(width, height)`` every prepared image must have.
        source: the dataset's :class:`~lightning_dprobust.data.files.DatasetSource`, for error messages.
        data_dir: the data directory, for error messages.
        prepare: an optional picklable PIL-to-PIL function (resize, crop, pad) applied before the size check.

    Shape:
        - image: ``(3, size[1], size[0])``.
    """

    def __init__(
        self,
        paths: Sequence[str | Path],
        targets: torch.Tensor,
        size: tuple[int, int],
        source: DatasetSource,
        data_dir: Path,
        prepare: Callable[[Image.Image], Image.Image] | None = None,
    ) -> None:
        if len(paths) != len(targets):
            raise ValueError(f"got {len(paths)} image paths but {len(targets)} targets: they must match one to one")
        self.paths = [str(path) for path in paths]
        self.targets = targets
        self.size = size
        self.source = source
        self.data_dir = data_dir
        self.prepare = prepare

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        path = self.paths[index]
        try:
            with Image.open(path) as file:
                image = file.convert("RGB")
        except (OSError, SyntaxError, ValueError) as err:
            raise self.source.corrupt(self.data_dir, path, f"cannot decode the image ({err})") from err
        if self.prepare is not None:
            image = self.prepare(image)
        if image.size != self.size:
            raise self.source.corrupt(
                self.data_dir, path, f"image is {image.size[0]}x{image.size[1]}, expected {self.size[0]}x{self.size[1]}"
            )
        return to_tensor(image), self.targets[index]
