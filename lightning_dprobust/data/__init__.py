"""Data modules: each yields unnormalized ``[0, 1]`` images (docs/design.md, contract 1)."""

from __future__ import annotations

from lightning_dprobust.data.base import DatasetNotFoundError, ImageDataModule, resolve_data_dir
from lightning_dprobust.data.celeba import CelebADataModule
from lightning_dprobust.data.cifar10 import CIFAR10DataModule
from lightning_dprobust.data.cifar100 import CIFAR100DataModule
from lightning_dprobust.data.digits import DigitsDataModule
from lightning_dprobust.data.ehr import EHRDataModule
from lightning_dprobust.data.ehr_schema import EHRSchema
from lightning_dprobust.data.idc import IDCDataModule
from lightning_dprobust.data.mnist import FashionMNISTDataModule, MNISTDataModule
from lightning_dprobust.data.mnist5k import MNIST5kDataModule
from lightning_dprobust.data.tiny_imagenet import TinyImageNetDataModule

DATAMODULES: dict[str, type[ImageDataModule]] = {
    "digits": DigitsDataModule,
    "mnist5k": MNIST5kDataModule,
    "mnist": MNISTDataModule,
    "fashion_mnist": FashionMNISTDataModule,
    "cifar10": CIFAR10DataModule,
    "cifar100": CIFAR100DataModule,
    "tiny_imagenet": TinyImageNetDataModule,
    "celeba": CelebADataModule,
    "idc": IDCDataModule,
}

__all__ = [
    "DATAMODULES",
    "CIFAR100DataModule",
    "CIFAR10DataModule",
    "CelebADataModule",
    "DatasetNotFoundError",
    "DigitsDataModule",
    "EHRDataModule",
    "EHRSchema",
    "FashionMNISTDataModule",
    "IDCDataModule",
    "ImageDataModule",
    "MNIST5kDataModule",
    "MNISTDataModule",
    "TinyImageNetDataModule",
    "resolve_data_dir",
]
