"""CIFAR-10 data module on fake python-pickle batches written in the official format."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch
from fake_data import CIFAR_FILES, check_batch, md5_of, truncate, write_cifar
from torchvision.datasets import CIFAR10

from lightning_dprobust.data import DatasetNotFoundError
from lightning_dprobust.data.cifar10 import CIFAR10DataModule

CIFAR_MD5 = "c99cafc152244af753f735de768cd75f"  # published MD5 of the real data_batch_1


@pytest.fixture
def cifar(tmp_path, monkeypatch):
    """Fake batches whose MD5 sums are made the published ones, so the real MD5 check runs on them."""
    paths = write_cifar(tmp_path)
    monkeypatch.setattr(CIFAR10, "train_list", [[name, md5_of(paths[name])] for name in CIFAR_FILES[:5]])
    monkeypatch.setattr(CIFAR10, "test_list", [["test_batch", md5_of(paths["test_batch"])]])
    monkeypatch.setattr(CIFAR10, "meta", {**CIFAR10.meta, "md5": md5_of(paths["batches.meta"])})
    return paths


def test_yields_the_written_images_in_unit_range(tmp_path, cifar):
    datamodule = CIFAR10DataModule(data_dir=str(tmp_path), val_fraction=0.25, batch_size=8, eval_batch_size=4)
    datamodule.setup("fit")
    assert (len(datamodule.train_set), len(datamodule.val_set), len(datamodule.test_set)) == (15, 5, 4)
    images, labels = next(iter(datamodule.test_dataloader()))
    check_batch(images, (3, 32, 32))
    batch = pickle.loads(cifar["test_batch"].read_bytes())
    expected = torch.from_numpy(batch["data"].reshape(4, 3, 32, 32)).float() / 255
    torch.testing.assert_close(images, expected)
    assert labels.dtype == torch.int64 and labels.tolist() == batch["labels"]
    images, labels = next(iter(datamodule.train_dataloader()))
    check_batch(images, (3, 32, 32))
    assert len(labels) == 8 and set(labels.tolist()) <= set(range(10))


def test_train_val_split_is_disjoint_and_fixed_by_seed(tmp_path, cifar):
    def split(seed: int) -> tuple[list[int], list[int]]:
        datamodule = CIFAR10DataModule(data_dir=str(tmp_path), val_fraction=0.2, seed=seed)
        datamodule.setup("fit")
        return list(datamodule.train_set.indices), list(datamodule.val_set.indices)

    train, val = split(3)
    assert sorted(train + val) == list(range(20)) and len(val) == 4
    assert split(3) == (train, val)
    assert {tuple(split(seed)[1]) for seed in range(5)} != {tuple(val)}


def test_file_failing_the_published_md5_is_rejected(tmp_path):
    write_cifar(tmp_path)
    with pytest.raises(DatasetNotFoundError, match=f"data_batch_1 .*MD5.*{CIFAR_MD5}"):
        CIFAR10DataModule(data_dir=str(tmp_path)).setup()


@pytest.mark.parametrize("name", [*CIFAR_FILES, "batches.meta"])
def test_truncated_file_is_caught_by_its_md5(tmp_path, cifar, name):
    truncate(cifar[name])
    with pytest.raises(DatasetNotFoundError, match=f"cifar-10-batches-py/{name} .*MD5"):
        CIFAR10DataModule(data_dir=str(tmp_path)).setup()


def test_truncated_batch_is_caught_without_md5(tmp_path, monkeypatch):
    paths = write_cifar(tmp_path)
    for module in ("torchvision.datasets.utils", "torchvision.datasets.cifar"):
        monkeypatch.setattr(f"{module}.check_integrity", lambda *args, **kwargs: True)
    truncate(paths["data_batch_4"])
    with pytest.raises(DatasetNotFoundError, match="cifar-10-batches-py .*corrupt.*(Unpickling|EOF)Error"):
        CIFAR10DataModule(data_dir=str(tmp_path)).setup()


def test_labels_outside_the_classes_are_rejected(tmp_path, monkeypatch):
    paths = write_cifar(tmp_path)
    batch = {"labels": [10, 11, 0, 1], "data": np.zeros((4, 3072), dtype=np.uint8)}
    paths["test_batch"].write_bytes(pickle.dumps(batch, protocol=2))
    monkeypatch.setattr("torchvision.datasets.utils.check_integrity", lambda *args, **kwargs: True)
    monkeypatch.setattr("torchvision.datasets.cifar.check_integrity", lambda *args, **kwargs: True)
    with pytest.raises(DatasetNotFoundError, match=r"class indices in \[0, 10\)"):
        CIFAR10DataModule(data_dir=str(tmp_path)).setup()


def test_missing_files_error_says_what_where_and_how(tmp_path):
    with pytest.raises(DatasetNotFoundError) as error:
        CIFAR10DataModule(data_dir=str(tmp_path)).setup()
    message = str(error.value)
    for expected in (str(tmp_path), "cifar-10-batches-py/batches.meta", "--data.data_dir", "DPROBUST_DATA"):
        assert expected in message
    assert all(f"cifar-10-batches-py/{name}" in message for name in CIFAR_FILES)
    assert "https://www.cs.toronto.edu/~kriz/cifar.html" in message


def test_failed_download_raises_dataset_not_found(tmp_path, no_network):
    with pytest.raises(DatasetNotFoundError, match="Downloading CIFAR-10 .*failed.*URLError"):
        CIFAR10DataModule(data_dir=str(tmp_path / "cifar"), download=True).prepare_data()
