"""Every TransDenoiser entry (digits shipped, MNIST and CIFAR-10 recipes) carries a guarantee for the pipeline
``h(g(x))`` that ``zoo.load`` returns.

Thesis chapter 6 assumes a public classifier ``h``: the denoiser's epsilon covers ``h(g(x))`` only if ``h`` never saw
the denoiser's training set. The denoiser must train on the private half of its dataset's train split and its
``meta.classifier`` on the public half (two disjoint halves of the same split, ``train_part=...`` of the data module).
"""

from __future__ import annotations

import pytest

from lightning_dprobust import zoo
from lightning_dprobust.zoo.build import config_sha256, recipe_config

DENOISERS = zoo.list_entries("*transdenoiser*")


def test_there_are_shipped_digits_denoisers_and_mnist_and_cifar10_recipes():
    assert {entry.name for entry in DENOISERS if entry.shipped} >= {
        "dncnn_gn.transdenoiser_digits_eps1_s025",
        "dncnn_gn.transdenoiser_digits_eps3_s025",
    }
    assert {entry.name for entry in DENOISERS} >= {
        "dncnn_gn.transdenoiser_mnist_eps1_s025",
        "dncnn_gn.transdenoiser_cifar10_eps1_s010",
    }


@pytest.mark.parametrize("entry", DENOISERS, ids=lambda entry: entry.name)
def test_the_denoiser_trains_on_the_private_half_and_its_classifier_on_the_public_half(entry):
    recipe = entry.meta["recipe"]
    if entry.shipped:
        assert recipe["config_sha256"] == config_sha256(recipe["config"]), (
            f"{entry.name} was built from another version of {recipe['config']}"
        )
    config, _ = recipe_config(entry)
    assert config["data"]["init_args"].get("train_part", "all") == "private"
    assert config["model"]["init_args"]["classifier"] == entry.meta["classifier"]
    classifier = zoo.info(entry.meta["classifier"])
    assert classifier.shipped or not entry.shipped  # a shipped denoiser comes with a shipped classifier
    classifier_config, _ = recipe_config(classifier)
    assert classifier_config["data"]["init_args"].get("train_part", "all") == "public", classifier.name
    split = ("seed", "test_fraction", "val_fraction")  # the halves are disjoint only if both split the same way
    assert {key: config["data"]["init_args"].get(key) for key in split} == {
        key: classifier_config["data"]["init_args"].get(key) for key in split
    }
    assert config["data"]["class_path"] == classifier_config["data"]["class_path"]
