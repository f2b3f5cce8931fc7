"""The registry of data modules and the class attributes every module declares."""

from __future__ import annotations

import pytest

from lightning_dprobust.data import DATAMODULES, ImageDataModule

SHAPES = {
    "digits": ((1, 8, 8), 10),
    "mnist5k": ((1, 28, 28), 10),
    "mnist": ((1, 28, 28), 10),
    "fashion_mnist": ((1, 28, 28), 10),
    "cifar10": ((3, 32, 32), 10),
    "cifar100": ((3, 32, 32), 100),
    "tiny_imagenet": ((3, 64, 64), 200),
    "celeba": ((3, 64, 64), 40),
    "idc": ((3, 50, 50), 2),
}


@pytest.mark.parametrize("key", sorted(SHAPES))
def test_registry_entry_declares_name_shape_classes_and_statistics(key):
    module = DATAMODULES[key]
    assert issubclass(module, ImageDataModule) and module.name == key
    assert (module.input_shape, module.num_classes) == SHAPES[key]
    channels = module.input_shape[0]
    assert len(module.mean) == len(module.std) == channels
    assert all(0 < m < 1 for m in module.mean) and all(0 < s < 1 for s in module.std)


def test_registry_holds_exactly_the_datasets_of_the_design():
    assert set(DATAMODULES) == set(SHAPES)


@pytest.mark.parametrize("key", sorted(SHAPES))
def test_default_data_dir_is_the_named_subfolder_of_the_environment_folder(key, tmp_path, monkeypatch):
    monkeypatch.setenv("DPROBUST_DATA", str(tmp_path))
    assert DATAMODULES[key]().data_dir == tmp_path / key
