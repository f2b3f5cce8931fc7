"""The shipped digits TransDenoiser entries carry a guarantee for the pipeline ``h(g(x))`` that ``zoo.load`` returns.

Thesis chapter 6 assumes a public classifier ``h``: the denoiser's epsilon covers ``h(g(x))`` only if ``h`` never saw
the denoiser's training set. The denoiser must train on the private half of the digits train split and its
``meta.classifier`` on the public half (two disjoint halves of the same split, ``DigitsDataModule(train_part=...)``).
"""

from __future__ import annotations

import hashlib

import pytest

from lightning_dprobust import zoo
from lightning_dprobust.zoo.build import REPO_ROOT, recipe_config

DENOISERS = [entry for entry in zoo.list_entries("*transdenoiser_digits*") if entry.shipped]


def test_there_are_shipped_digits_denoisers():
    assert {entry.name for entry in DENOISERS} >= {
        "dncnn_gn.transdenoiser_digits_eps1_s025",
        "dncnn_gn.transdenoiser_digits_eps3_s025",
    }


@pytest.mark.parametrize("entry", DENOISERS, ids=lambda entry: entry.name)
def test_the_denoiser_trains_on_the_private_half_and_its_classifier_on_the_public_half(entry):
    recipe = entry.meta["recipe"]
    assert recipe["config_sha256"] == hashlib.sha256((REPO_ROOT / recipe["config"]).read_bytes()).hexdigest(), (
        f"{entry.name} was built from another version of {recipe['config']}: rebuild it"
    )
    config, _ = recipe_config(entry)
    assert config["data"]["init_args"].get("train_part", "all") == "private"
    assert config["model"]["init_args"]["classifier"] == entry.meta["classifier"]
    classifier = zoo.info(entry.meta["classifier"])
    assert classifier.shipped
    classifier_config, _ = recipe_config(classifier)
    assert classifier_config["data"]["init_args"].get("train_part", "all") == "public", classifier.name
    split = ("seed", "test_fraction", "val_fraction")  # the halves are disjoint only if both split the same way
    assert {key: config["data"]["init_args"].get(key) for key in split} == {
        key: classifier_config["data"]["init_args"].get(key) for key in split
    }
    assert config["data"]["class_path"] == classifier_config["data"]["class_path"]
