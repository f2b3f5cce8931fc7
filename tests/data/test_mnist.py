"""MNIST and Fashion-MNIST data modules on fake idx files written in the official format."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from fake_data import MNIST_NAMES, check_batch, md5_of, truncate, write_idx, write_mnist

from lightning_dprobust.data import DatasetNotFoundError
from lightning_dprobust.data.mnist import FashionMNISTDataModule, MNISTDataModule

MODULES = [(MNISTDataModule, "MNIST"), (FashionMNISTDataModule, "FashionMNIST")]


def publish_fake_md5(monkeypatch: pytest.MonkeyPatch, module: type[MNISTDataModule], paths: dict) -> None:
    """Make the fake archives' MD5 sums the published ones, so torchvision's real MD5 check runs on them."""
    monkeypatch.setattr(module.dataset_cls, "resources", [(path.name, md5_of(path)) for path in paths.values()])


def accept_any_md5(monkeypatch: pytest.MonkeyPatch) -> None:
    """Patch torchvision's integrity check as torchvision's own dataset tests do."""
    monkeypatch.setattr("torchvision.datasets.utils.check_integrity", lambda *args, **kwargs: True)


@pytest.mark.parametrize(("module", "folder"), MODULES)
def test_yields_the_written_images_in_unit_range(tmp_path, module, folder):
    fake = write_mnist(tmp_path, folder)
    datamodule = module(data_dir=str(tmp_path), val_fraction=0.2, eval_batch_size=10)
    datamodule.setup("fit")
    assert (len(datamodule.train_set), len(datamodule.val_set), len(datamodule.test_set)) == (16, 4, 10)
    images, labels = next(iter(datamodule.test_dataloader()))
    check_batch(images, module.input_shape)
    assert labels.dtype == torch.int64
    expected = torch.from_numpy(fake["arrays"]["t10k-images-idx3-ubyte"]).float() / 255
    torch.testing.assert_close(images[:, 0], expected)
    assert labels.tolist() == fake["arrays"]["t10k-labels-idx1-ubyte"].tolist()
    train_labels = [int(datamodule.train_set[i][1]) for i in range(16)] + [
        int(datamodule.val_set[i][1]) for i in range(4)
    ]
    assert sorted(train_labels) == sorted(fake["arrays"]["train-labels-idx1-ubyte"].tolist())


def test_train_val_split_is_disjoint_and_fixed_by_seed(tmp_path):
    write_mnist(tmp_path)

    def split(seed: int) -> tuple[list[int], list[int]]:
        datamodule = MNISTDataModule(data_dir=str(tmp_path), val_fraction=0.25, seed=seed)
        datamodule.setup("fit")
        return list(datamodule.train_set.indices), list(datamodule.val_set.indices)

    train, val = split(0)
    assert not set(train) & set(val) and sorted(train + val) == list(range(20)) and len(val) == 5
    assert split(0) == (train, val)
    assert {tuple(split(seed)[1]) for seed in range(5)} != {tuple(val)}


def test_reads_md5_verified_gz_archives(tmp_path, monkeypatch):
    fake = write_mnist(tmp_path, gz=True)
    publish_fake_md5(monkeypatch, MNISTDataModule, fake["paths"])
    datamodule = MNISTDataModule(data_dir=str(tmp_path))
    datamodule.setup("test")
    expected = torch.from_numpy(fake["arrays"]["t10k-images-idx3-ubyte"][3]).float() / 255
    torch.testing.assert_close(datamodule.test_set[3][0][0], expected)
    assert all((tmp_path / "MNIST" / "raw" / name).is_file() for name in MNIST_NAMES)


def test_archive_failing_the_published_md5_is_rejected(tmp_path):
    write_mnist(tmp_path, gz=True)
    with pytest.raises(
        DatasetNotFoundError, match=r"train-images-idx3-ubyte\.gz.*MD5.*f68b3c2dcbeaaa9fbdd348bbdeb94873"
    ):
        MNISTDataModule(data_dir=str(tmp_path)).setup()


def test_truncated_archive_is_caught_by_its_md5(tmp_path, monkeypatch):
    fake = write_mnist(tmp_path, gz=True)
    publish_fake_md5(monkeypatch, MNISTDataModule, fake["paths"])
    truncate(fake["paths"]["t10k-labels-idx1-ubyte"])
    with pytest.raises(DatasetNotFoundError, match=r"t10k-labels-idx1-ubyte\.gz.*MD5"):
        MNISTDataModule(data_dir=str(tmp_path)).setup()


def test_truncated_archive_is_caught_without_md5(tmp_path, monkeypatch):
    fake = write_mnist(tmp_path, gz=True)
    accept_any_md5(monkeypatch)
    truncate(fake["paths"]["train-images-idx3-ubyte"])
    with pytest.raises(DatasetNotFoundError, match=r"train-images-idx3-ubyte\.gz.*cannot decompress"):
        MNISTDataModule(data_dir=str(tmp_path)).setup()
    assert not (tmp_path / "MNIST" / "raw" / "train-images-idx3-ubyte").exists()


@pytest.mark.parametrize("name", MNIST_NAMES)
def test_truncated_idx_file_is_named(tmp_path, name):
    fake = write_mnist(tmp_path)
    truncate(fake["paths"][name], keep=0.9)
    with pytest.raises(DatasetNotFoundError, match=rf"{name} .*truncated") as error:
        MNISTDataModule(data_dir=str(tmp_path)).setup()
    assert str(tmp_path) in str(error.value)


def test_wrong_magic_number_and_count_mismatch_are_rejected(tmp_path):
    write_mnist(tmp_path)
    raw = tmp_path / "MNIST" / "raw"
    data = bytearray((raw / "t10k-images-idx3-ubyte").read_bytes())
    data[2] = 0x0D  # float32 type code instead of unsigned byte
    (raw / "t10k-images-idx3-ubyte").write_bytes(bytes(data))
    with pytest.raises(DatasetNotFoundError, match="t10k-images-idx3-ubyte .*magic number 0x00000d03"):
        MNISTDataModule(data_dir=str(tmp_path)).setup()
    write_mnist(tmp_path)
    write_idx(raw / "train-labels-idx1-ubyte", np.zeros(19, dtype=np.uint8))
    with pytest.raises(DatasetNotFoundError, match="train-labels-idx1-ubyte .*19 labels for 20 images"):
        MNISTDataModule(data_dir=str(tmp_path)).setup()


def test_labels_outside_the_classes_are_rejected(tmp_path):
    write_mnist(tmp_path)
    write_idx(tmp_path / "MNIST" / "raw" / "t10k-labels-idx1-ubyte", np.full(10, 12, dtype=np.uint8))
    with pytest.raises(DatasetNotFoundError, match=r"class indices in \[0, 10\)"):
        MNISTDataModule(data_dir=str(tmp_path)).setup()


@pytest.mark.parametrize(("module", "folder"), MODULES)
def test_missing_files_error_says_what_where_and_how(tmp_path, module, folder):
    data_dir = tmp_path / "nowhere"
    with pytest.raises(DatasetNotFoundError) as error:
        module(data_dir=str(data_dir)).setup()
    message = str(error.value)
    for expected in (
        *MNIST_NAMES,
        str(data_dir),
        f"{folder}/raw",
        "--data.data_dir",
        "DPROBUST_DATA",
        "--data.download",
    ):
        assert expected in message
    assert "https://" in message


def test_missing_error_lists_only_the_absent_file(tmp_path):
    fake = write_mnist(tmp_path)
    fake["paths"]["t10k-labels-idx1-ubyte"].unlink()
    with pytest.raises(DatasetNotFoundError, match="missing MNIST/raw/t10k-labels-idx1-ubyte ") as error:
        MNISTDataModule(data_dir=str(tmp_path)).setup()
    assert "train-images" not in str(error.value).split("Expected layout")[0]


def test_data_dir_defaults_to_the_environment_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("DPROBUST_DATA", str(tmp_path))
    write_mnist(tmp_path / "fashion_mnist", "FashionMNIST")
    datamodule = FashionMNISTDataModule()
    datamodule.setup("test")
    assert datamodule.data_dir == tmp_path / "fashion_mnist" and len(datamodule.test_set) == 10


def test_failed_download_raises_dataset_not_found(tmp_path, no_network):
    with pytest.raises(DatasetNotFoundError, match="Downloading MNIST .*failed.*--data.data_dir"):
        MNISTDataModule(data_dir=str(tmp_path), download=True).prepare_data()


def test_download_reuses_verified_archives_without_network(tmp_path, monkeypatch, no_network):
    fake = write_mnist(tmp_path, gz=True)
    publish_fake_md5(monkeypatch, MNISTDataModule, fake["paths"])
    datamodule = MNISTDataModule(data_dir=str(tmp_path), download=True)
    datamodule.prepare_data()
    datamodule.setup("fit")
    assert len(datamodule.train_set) + len(datamodule.val_set) == 20


def test_rejects_a_bad_val_fraction():
    with pytest.raises(ValueError, match="val_fraction must lie in"):
        MNISTDataModule(val_fraction=1.0)
