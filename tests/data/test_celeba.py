"""CelebA data module on fake aligned images and annotation files in the official format."""

from __future__ import annotations

import pytest
import torch
from fake_data import check_batch, md5_of, truncate, write_celeba
from torchvision.datasets import CelebA

from lightning_dprobust.data import DatasetNotFoundError
from lightning_dprobust.data.celeba import ATTRIBUTES, CelebADataModule

PARTITION = (0, 0, 0, 0, 1, 1, 2, 2, 2)
ATTR_MD5 = "75e246fa4810816ffd6ee81facbd244c"  # published MD5 of the real list_attr_celeba.txt


@pytest.fixture
def values(tmp_path, monkeypatch):
    """Fake CelebA files whose MD5 sums are made the published ones; returns the written -1/1 attributes."""
    written = write_celeba(tmp_path, PARTITION)
    md5 = {name: md5_of(tmp_path / name) for name in ("list_attr_celeba.txt", "list_eval_partition.txt")}
    entries = [(file_id, md5.get(name, checksum), name) for file_id, checksum, name in CelebA.file_list]
    monkeypatch.setattr(CelebA, "file_list", entries)
    return torch.from_numpy(written)


def test_multilabel_targets_follow_the_official_partition(tmp_path, values):
    datamodule = CelebADataModule(data_dir=str(tmp_path), eval_batch_size=8)
    datamodule.setup("fit")
    assert datamodule.multilabel and datamodule.num_classes == 40 and len(ATTRIBUTES) == 40
    assert [len(split) for split in (datamodule.train_set, datamodule.val_set, datamodule.test_set)] == [4, 2, 3]
    images, targets = next(iter(datamodule.test_dataloader()))
    check_batch(images, (3, 64, 64))
    assert targets.dtype == torch.float32 and targets.shape == (3, 40)
    torch.testing.assert_close(targets, (values[6:] == 1).float())
    _, val_targets = next(iter(datamodule.val_dataloader()))
    torch.testing.assert_close(val_targets, (values[4:6] == 1).float())


def test_crop_keeps_the_centre_and_drops_the_top_and_bottom_bands(tmp_path, values):
    datamodule = CelebADataModule(data_dir=str(tmp_path))
    datamodule.setup("fit")
    image, _ = datamodule.train_set[0]
    assert image.shape == (3, 64, 64)
    assert image[0].max() < 0.1 and image[2].min() > 0.9  # only the blue centre remains, no red band


def test_single_attribute_gives_binary_class_indices(tmp_path, values):
    datamodule = CelebADataModule(data_dir=str(tmp_path), target_attribute="Smiling", batch_size=4)
    datamodule.setup("fit")
    assert datamodule.num_classes == 2 and not datamodule.multilabel
    targets = torch.stack([datamodule.train_set[i][1] for i in range(4)])
    assert targets.dtype == torch.int64
    assert targets.tolist() == (values[:4, ATTRIBUTES.index("Smiling")] == 1).long().tolist()
    assert ATTRIBUTES.index("Smiling") == 31  # column of "Smiling" in the official file


def test_unknown_attribute_is_rejected_with_the_valid_names():
    with pytest.raises(ValueError, match="unknown CelebA attribute 'smile'.*Smiling"):
        CelebADataModule(target_attribute="smile")


def test_annotation_failing_the_published_md5_is_rejected(tmp_path):
    write_celeba(tmp_path, PARTITION)
    with pytest.raises(DatasetNotFoundError, match=f"list_attr_celeba.txt .*MD5.*{ATTR_MD5}"):
        CelebADataModule(data_dir=str(tmp_path)).setup()


def test_truncated_annotation_is_caught_by_its_md5(tmp_path, values):
    truncate(tmp_path / "list_eval_partition.txt", keep=0.7)
    with pytest.raises(DatasetNotFoundError, match="list_eval_partition.txt .*MD5"):
        CelebADataModule(data_dir=str(tmp_path)).setup()


@pytest.mark.parametrize(("name", "reason"), [("list_attr_celeba.txt", "rows|lines"), ("list_eval_partition.txt", "")])
def test_truncated_annotation_is_caught_without_md5(tmp_path, monkeypatch, name, reason):
    write_celeba(tmp_path, PARTITION)
    monkeypatch.setattr("torchvision.datasets.utils.check_integrity", lambda *args, **kwargs: True)
    truncate(tmp_path / name, keep=0.8)
    with pytest.raises(DatasetNotFoundError, match=f"{name} .*corrupt.*({reason})"):
        CelebADataModule(data_dir=str(tmp_path)).setup()


def test_missing_and_truncated_images_are_named(tmp_path, values):
    truncate(tmp_path / "img_align_celeba" / "000002.jpg")
    datamodule = CelebADataModule(data_dir=str(tmp_path))
    datamodule.setup("fit")
    with pytest.raises(DatasetNotFoundError, match="000002.jpg .*cannot decode"):
        datamodule.train_set[1]
    (tmp_path / "img_align_celeba" / "000008.jpg").unlink()
    with pytest.raises(DatasetNotFoundError, match="missing img_align_celeba/000008.jpg"):
        CelebADataModule(data_dir=str(tmp_path)).setup()


def test_missing_files_error_says_what_where_and_how(tmp_path):
    with pytest.raises(DatasetNotFoundError) as error:
        CelebADataModule(data_dir=str(tmp_path)).setup()
    message = str(error.value)
    for expected in (
        "missing img_align_celeba, list_attr_celeba.txt, list_eval_partition.txt",
        str(tmp_path),
        "--data.data_dir",
        "DPROBUST_DATA",
    ):
        assert expected in message
    assert "https://mmlab.ie.cuhk.edu.hk/projects/CelebA.html" in message


@pytest.mark.parametrize(
    ("edit", "reason"), [(lambda row: row[:-3], "cannot parse"), (lambda row: row[:-2] + "0", "-1 or 1")]
)
def test_malformed_attribute_row_is_rejected(tmp_path, monkeypatch, edit, reason):
    write_celeba(tmp_path, PARTITION)
    monkeypatch.setattr("torchvision.datasets.utils.check_integrity", lambda *args, **kwargs: True)
    lines = (tmp_path / "list_attr_celeba.txt").read_text().splitlines()
    lines[4] = edit(lines[4])
    (tmp_path / "list_attr_celeba.txt").write_text("\n".join(lines) + "\n")
    with pytest.raises(DatasetNotFoundError, match=f"list_attr_celeba.txt .*{reason}"):
        CelebADataModule(data_dir=str(tmp_path)).setup()
