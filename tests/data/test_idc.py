"""IDC data module on fake patient folders of 50x50 PNG patches in the official layout."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import torch
from fake_data import check_batch, solid, truncate, write_idc, write_image
from PIL import Image

from lightning_dprobust.data import DatasetNotFoundError
from lightning_dprobust.data.idc import IDCDataModule

PATCHES = {"8863": (3, 1), "9029": (2, 2), "10253": (4, 0), "10254": (1, 3), "12626": (2, 1), "13106": (3, 2)}
TOTAL = sum(sum(counts) for counts in PATCHES.values()) + 1  # plus the border patch


@pytest.fixture
def idc(tmp_path) -> Path:
    write_idc(tmp_path, PATCHES, small="9029")
    return tmp_path


def make(root: Path, seed: int = 0) -> IDCDataModule:
    datamodule = IDCDataModule(data_dir=str(root), train_size=0.4, test_size=0.25, seed=seed, eval_batch_size=64)
    datamodule.setup("fit")
    return datamodule


def patients_of(dataset) -> set[str]:
    return {Path(path).parts[-3] for path in dataset.paths}


def test_yields_patches_in_unit_range_with_binary_labels(idc):
    datamodule = make(idc)
    for loader in (datamodule.train_dataloader(), datamodule.val_dataloader(), datamodule.test_dataloader()):
        images, labels = next(iter(loader))
        check_batch(images, (3, 50, 50))
        assert labels.dtype == torch.int64 and set(labels.tolist()) <= {0, 1}
    first = Image.open(datamodule.train_set.paths[0])
    expected = torch.from_numpy(np.array(first.convert("RGB"))).permute(2, 0, 1).float() / 255
    torch.testing.assert_close(datamodule.train_set[0][0], expected)
    labels = [
        int(label)
        for split in (datamodule.train_set, datamodule.val_set, datamodule.test_set)
        for label in split.targets
    ]
    assert sorted(labels) == sorted([0] * 15 + [1] * 10)


def test_label_is_the_folder_of_each_patch(idc):
    datamodule = make(idc)
    for split in (datamodule.train_set, datamodule.val_set, datamodule.test_set):
        assert [int(Path(path).parts[-2]) for path in split.paths] == split.targets.tolist()


def test_no_patient_is_in_two_splits_and_every_patch_is_used(idc):
    datamodule = make(idc)
    train, val, test = (patients_of(split) for split in (datamodule.train_set, datamodule.val_set, datamodule.test_set))
    assert not (train & val or train & test or val & test)
    assert train | val | test == set(PATCHES)
    assert len(datamodule.train_set) + len(datamodule.val_set) + len(datamodule.test_set) == TOTAL
    assert {"train": sorted(train), "val": sorted(val), "test": sorted(test)} == datamodule.patients
    largest = max(sum(counts) for counts in PATCHES.values()) + 1
    for split, fraction in ((datamodule.train_set, 0.4), (datamodule.test_set, 0.25)):
        assert round(fraction * TOTAL) <= len(split) < round(fraction * TOTAL) + largest


def test_split_is_fixed_by_seed(idc):
    assert make(idc, seed=4).patients == make(idc, seed=4).patients
    assert len({str(make(idc, seed=seed).patients) for seed in range(6)}) > 1


def locate(datamodule: IDCDataModule, name: str) -> tuple:
    """The split holding the patch whose file is ``name``, and its index there."""
    sets = (datamodule.train_set, datamodule.val_set, datamodule.test_set)
    return next((split, i) for split in sets for i, path in enumerate(split.paths) if Path(path).name == name)


def test_border_patch_is_padded_with_white(idc):
    split, index = locate(make(idc), "9029_idx5_x9999_y0_class1.png")
    image, label = split[index]
    assert image.shape == (3, 50, 50) and int(label) == 1
    torch.testing.assert_close(image[:, :40, :30], torch.tensor([10, 20, 30]).view(3, 1, 1).expand(3, 40, 30) / 255)
    assert (image[:, 40:, :] == 1).all() and (image[:, :, 30:] == 1).all()


def test_oversized_and_truncated_patches_are_named_when_read(idc):
    write_image(idc / "13106" / "0" / "13106_idx5_x0_y0_class0.png", solid((1, 2, 3), 60, 60))
    truncate(idc / "8863" / "1" / "8863_idx5_x0_y0_class1.png")
    datamodule = make(idc)
    split, index = locate(datamodule, "13106_idx5_x0_y0_class0.png")
    with pytest.raises(DatasetNotFoundError, match="13106_idx5_x0_y0_class0.png .*60x60, expected 50x50"):
        split[index]
    split, index = locate(datamodule, "8863_idx5_x0_y0_class1.png")
    with pytest.raises(DatasetNotFoundError, match="8863_idx5_x0_y0_class1.png .*cannot decode"):
        split[index]


def test_paper_split_sizes_require_the_full_dataset(idc):
    with pytest.raises(
        DatasetNotFoundError, match=f"incomplete: found {TOTAL} patches but the official release has 277524.*fractions"
    ):
        IDCDataModule(data_dir=str(idc)).setup()


def test_missing_folder_error_says_what_where_and_how(tmp_path):
    (tmp_path / "IDC_regular_ps50_idx5").mkdir()  # a folder without patient data is ignored
    with pytest.raises(DatasetNotFoundError) as error:
        IDCDataModule(data_dir=str(tmp_path)).setup()
    message = str(error.value)
    for expected in ("<patient_id>/0/*.png", str(tmp_path), "--data.data_dir", "DPROBUST_DATA", "kaggle.com"):
        assert expected in message


@pytest.mark.parametrize(("train_size", "test_size"), [(0.5, 100), (0.6, 0.5), (0, 10), (1.0, 0.2)])
def test_rejects_inconsistent_split_sizes(train_size, test_size):
    with pytest.raises(ValueError, match="must both be patch counts"):
        IDCDataModule(train_size=train_size, test_size=test_size)


def test_too_few_patients_for_three_splits(tmp_path):
    write_idc(tmp_path, {"1": (2, 2), "2": (2, 2)})
    with pytest.raises(ValueError, match="2 groups cannot fill 3 non-empty parts"):
        make(tmp_path)


@pytest.mark.parametrize("absent", [0, 1])
def test_a_class_absent_from_the_folder_is_refused(tmp_path, absent):
    """Without one class's folders a model learns a constant and reports its accuracy as if it had learnt IDC."""
    write_idc(tmp_path, {patient: (0, n) if absent == 0 else (n, 0) for patient, (n, _) in PATCHES.items()})
    with pytest.raises(DatasetNotFoundError, match=f"found no patch of class {absent} .*<patient_id>/{absent}/") as e:
        make(tmp_path)
    assert "\n" not in str(e.value) and str(tmp_path) in str(e.value)


def test_a_training_split_without_one_class_is_refused(tmp_path):
    write_idc(tmp_path, {**{str(n): (3, 0) for n in range(7)}, "7": (2, 3)})
    refused = 0
    for seed in range(8):
        try:
            datamodule = make(tmp_path, seed=seed)
        except ValueError as error:
            assert re.search(r"the train split .* holds no patch of class 1 .*--data.seed", str(error))
            assert "\n" not in str(error)
            refused += 1
        else:
            assert set(datamodule.train_set.targets.tolist()) == {0, 1}
    assert 0 < refused < 8
