"""Every shipped config parses; configs whose dataset needs files fail with the data module's clear error."""

from __future__ import annotations

from pathlib import Path

import pytest

from lightning_dprobust.cli import main
from lightning_dprobust.recipes import CONFIG_DIR, build_recipe

CONFIGS = sorted(path for path in CONFIG_DIR.glob("*/*.yaml") if path.parent.name != "base")
EMBEDDED_SHAPES = {"digits": (1, 8, 8), "mnist5k": (1, 28, 28)}
EMBEDDED = [path for path in CONFIGS if path.stem in EMBEDDED_SHAPES]
EMBEDDED_EHR = {"synthetic"}  # the embedded synthetic EHR set: tests/test_ehr_configs.py
NEEDS_FILES = [path for path in CONFIGS if path.stem not in EMBEDDED_SHAPES and path.stem not in EMBEDDED_EHR]


def test_every_method_has_a_digits_config_and_the_paper_datasets():
    names = {f"{path.parent.name}/{path.stem}" for path in CONFIGS}
    assert {"dpsgd/digits", "erm/digits", "dpcert/digits", "dpadv/digits"} <= names
    assert {"dpsgd/mnist5k", "erm/mnist5k", "dpcert/mnist5k", "dpadv/mnist5k"} <= names
    assert {"dpcert/mnist", "dpcert/fashion_mnist", "dpcert/cifar10"} <= names
    assert {"dpadv/mnist", "dpadv/fashion_mnist", "dpadv/cifar10", "dpadv/celeba"} <= names
    assert {"residual/digits", "residual/cifar10", "residual/cifar100", "residual/idc"} <= names
    assert {"stobatch/digits", "stobatch/mnist", "stobatch/cifar10", "stobatch/tiny_imagenet"} <= names


@pytest.mark.parametrize("config", EMBEDDED, ids=lambda path: f"{path.parent.name}/{path.stem}")
def test_embedded_data_configs_instantiate(config: Path):
    cli = build_recipe(config, ["--trainer.logger=false"])
    assert cli.model.num_classes == 10 and tuple(cli.model.input_shape) == EMBEDDED_SHAPES[config.stem]


@pytest.mark.parametrize("config", NEEDS_FILES, ids=lambda path: f"{path.parent.name}/{path.stem}")
def test_missing_dataset_files_exit_2_with_the_data_modules_message(config: Path, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # pretrained timm weights cannot be fetched here: fail at once
    monkeypatch.chdir(tmp_path)
    empty = tmp_path / "no_data"
    empty.mkdir()
    code = main(["fit", "--config", str(config), "--data.init_args.data_dir", str(empty), "--trainer.logger", "false"])
    message = capsys.readouterr().err
    assert code == 2, message[-2000:]
    assert message.startswith("dprobust: error:") and "Traceback" not in message
    # a TransDenoiser recipe whose public classifier is itself a zoo recipe says how to build that classifier first
    assert str(empty) in message or "pretrained weights" in message or "dprobust zoo build" in message
