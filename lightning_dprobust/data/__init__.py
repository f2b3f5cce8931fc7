"""Data modules: each yields unnormalized ``[0, 1]`` images (DESIGN.md, contract 1)."""

from lightning_dprobust.data.base import DatasetNotFoundError, ImageDataModule, resolve_data_dir
from lightning_dprobust.data.digits import DigitsDataModule

__all__ = ["DatasetNotFoundError", "DigitsDataModule", "ImageDataModule", "resolve_data_dir"]
