"""CIFAR-100 data module on fake python pickles written in the official format."""

from __future__ import annotations

import pickle

import pytest
import torch
from fake_data import check_batch, md5_of, truncate, write_cifar100
from torchvision.datasets import CIFAR100

from lightning_dprobust.data import DATAMODULES, DatasetNotFoundError
from lightning_dprobust.data.cifar100 import CIFAR100DataModule

TRAIN_MD5 = "16019d7e3df5f24257cddd939b257f8d"  # published MD5 of the real train pickle


@pytest.fixture
def cifar100(tmp_path, monkeypatch):
    """Fake pickles whose MD5 sums are made the published ones, so the real MD5 check runs on them."""
    paths = write_cifar100(tmp_path)
    monkeypatch.setattr(CIFAR100, "train_list", [["train", md5_of(paths["train"])]])
    monkeypatch.setattr(CIFAR100, "test_list", [["test", md5_of(paths["test"])]])
    monkeypatch.setattr(CIFAR100, "meta", {**CIFAR100.meta, "md5": md5_of(paths["meta"])})
    return paths


def test_yields_fine_labels_and_unit_range_images(tmp_path, cifar100):
    datamodule = CIFAR100DataModule(data_dir=str(tmp_path), val_fraction=0.25, batch_size=5, eval_batch_size=8)
    datamodule.setup("fit")
    assert (len(datamodule.train_set), len(datamodule.val_set), len(datamodule.test_set)) == (15, 5, 8)
    images, labels = next(iter(datamodule.test_dataloader()))
    check_batch(images, (3, 32, 32))
    batch = pickle.loads(cifar100["test"].read_bytes())
    torch.testing.assert_close(images, torch.from_numpy(batch["data"].reshape(8, 3, 32, 32)).float() / 255)
    assert labels.tolist() == batch["fine_labels"] and max(labels.tolist()) > 19
    assert DATAMODULES["cifar100"] is CIFAR100DataModule and datamodule.num_classes == 100


def test_file_failing_the_published_md5_is_rejected(tmp_path):
    write_cifar100(tmp_path)
    with pytest.raises(DatasetNotFoundError, match=f"train .*MD5.*{TRAIN_MD5}"):
        CIFAR100DataModule(data_dir=str(tmp_path)).setup()


def test_missing_or_truncated_files_name_the_file(tmp_path, cifar100):
    truncate(cifar100["test"])
    with pytest.raises(DatasetNotFoundError, match="test"):
        CIFAR100DataModule(data_dir=str(tmp_path)).setup()
    with pytest.raises(DatasetNotFoundError, match="cifar-100-python"):
        CIFAR100DataModule(data_dir=str(tmp_path / "empty")).setup()
