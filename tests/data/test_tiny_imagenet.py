"""Tiny ImageNet data module on a fake ``tiny-imagenet-200`` folder in the official layout."""

from __future__ import annotations

import pytest
import torch
from fake_data import check_batch, class_colour, labels_of, truncate, write_tiny_imagenet

from lightning_dprobust.data import DatasetNotFoundError
from lightning_dprobust.data.tiny_imagenet import TinyImageNetDataModule


@pytest.fixture
def wnids(tmp_path, monkeypatch):
    """Three classes with 4 training and 2 validation images each; the per-class counts are made the official."""
    monkeypatch.setattr(TinyImageNetDataModule, "train_per_class", 4)
    monkeypatch.setattr(TinyImageNetDataModule, "val_per_class", 2)
    return write_tiny_imagenet(tmp_path)


def mean_colours(images: torch.Tensor) -> torch.Tensor:
    return images.mean(dim=(2, 3))


def test_yields_class_coloured_images_in_unit_range(tmp_path, wnids):
    datamodule = TinyImageNetDataModule(data_dir=str(tmp_path), val_fraction=0.25, eval_batch_size=6)
    datamodule.setup("fit")
    assert datamodule.classes == wnids and datamodule.num_classes == 3 and TinyImageNetDataModule.num_classes == 200
    assert (len(datamodule.train_set), len(datamodule.val_set), len(datamodule.test_set)) == (9, 3, 6)
    images, labels = next(iter(datamodule.test_dataloader()))
    check_batch(images, (3, 64, 64))
    assert labels.dtype == torch.int64 and labels.tolist() == [0, 0, 1, 1, 2, 2]
    expected = torch.tensor([class_colour(int(label)) for label in labels]) / 255
    torch.testing.assert_close(mean_colours(images), expected, atol=0.02, rtol=0)


def test_train_labels_follow_wnids_and_grayscale_gets_three_channels(tmp_path, wnids):
    datamodule = TinyImageNetDataModule(data_dir=str(tmp_path), val_fraction=0.0)
    datamodule.setup("fit")
    assert sorted(labels_of(datamodule.train_set)) == [0] * 4 + [1] * 4 + [2] * 4
    for index in range(12):
        image, label = datamodule.train_set[index]
        colour = mean_colours(image[None])[0]
        if index == 0:  # the grayscale file of class 0
            torch.testing.assert_close(colour, torch.full((3,), 128 / 255), atol=0.02, rtol=0)
        else:
            torch.testing.assert_close(colour, torch.tensor(class_colour(int(label))) / 255, atol=0.02, rtol=0)


def test_train_val_split_is_disjoint_and_fixed_by_seed(tmp_path, wnids):
    def split(seed: int) -> tuple[list[int], list[int]]:
        datamodule = TinyImageNetDataModule(data_dir=str(tmp_path), val_fraction=0.25, seed=seed)
        datamodule.setup("fit")
        return list(datamodule.train_set.indices), list(datamodule.val_set.indices)

    train, val = split(1)
    assert sorted(train + val) == list(range(12))
    assert split(1) == (train, val)
    assert {tuple(split(seed)[1]) for seed in range(5)} != {tuple(val)}


def test_missing_folder_error_says_what_where_and_how(tmp_path):
    with pytest.raises(DatasetNotFoundError) as error:
        TinyImageNetDataModule(data_dir=str(tmp_path)).setup()
    message = str(error.value)
    for expected in ("tiny-imagenet-200/wnids.txt", "tiny-imagenet-200/val/val_annotations.txt", str(tmp_path)):
        assert expected in message
    assert "--data.data_dir" in message and "DPROBUST_DATA" in message
    assert "http://cs231n.stanford.edu/tiny-imagenet-200.zip" in message


def test_missing_class_folder_and_validation_image_are_named(tmp_path, wnids):
    base = tmp_path / "tiny-imagenet-200"
    (base / "val" / "images" / "val_3.JPEG").unlink()
    with pytest.raises(DatasetNotFoundError, match="missing tiny-imagenet-200/val/images/val_3.JPEG"):
        TinyImageNetDataModule(data_dir=str(tmp_path)).setup()
    (base / "wnids.txt").write_text("\n".join([*wnids, "n99999999"]))
    with pytest.raises(DatasetNotFoundError, match="missing tiny-imagenet-200/train/n99999999/images"):
        TinyImageNetDataModule(data_dir=str(tmp_path)).setup()


def test_incomplete_class_and_bad_annotations_are_rejected(tmp_path, wnids):
    base = tmp_path / "tiny-imagenet-200"
    (base / "train" / wnids[2] / "images" / f"{wnids[2]}_3.JPEG").unlink()
    with pytest.raises(DatasetNotFoundError, match=f"train/{wnids[2]}/images .*3 of 4 images"):
        TinyImageNetDataModule(data_dir=str(tmp_path)).setup()
    write_tiny_imagenet(tmp_path / "other")
    annotations = tmp_path / "other" / "tiny-imagenet-200" / "val" / "val_annotations.txt"
    annotations.write_text(annotations.read_text().replace(wnids[1], "n12345678", 1))
    with pytest.raises(DatasetNotFoundError, match="val_annotations.txt .*n12345678"):
        TinyImageNetDataModule(data_dir=str(tmp_path / "other")).setup()


def test_truncated_image_is_named_when_read(tmp_path, wnids):
    path = tmp_path / "tiny-imagenet-200" / "val" / "images" / "val_4.JPEG"
    truncate(path)
    datamodule = TinyImageNetDataModule(data_dir=str(tmp_path))
    datamodule.setup("test")
    datamodule.test_set[3]
    with pytest.raises(DatasetNotFoundError, match=f"{path} .*cannot decode"):
        datamodule.test_set[4]
