"""One name for the DP seed: ``seed``, as ``DPCallback(seed=...)``. The old ``noise_seed`` of StoBatch, residual
perturbation and TransDenoiser still loads saved configs and checkpoints, warning once."""

from __future__ import annotations

import warnings

import pytest
import torch

from lightning_dprobust.methods import ResidualPerturbation, StoBatch, TransDenoiser
from lightning_dprobust.methods import base as methods_base
from lightning_dprobust.methods.base import CLASS_KEY
from lightning_dprobust.methods.checkpoints import load_checkpoint_module
from lightning_dprobust.methods.registry import qualified_name
from lightning_dprobust.recipes import CONFIG_DIR, build_recipe
from tests.methods.transdenoiser_helpers import TINY, public_classifier

SHAPE = {"num_classes": 10, "input_shape": (1, 8, 8)}


def build(cls: type, **kwargs):
    extra = {"classifier": public_classifier(), "denoiser_kwargs": TINY} if cls is TransDenoiser else {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # a fixed seed is a warned test mode
        return cls(**SHAPE, **extra, **kwargs)


@pytest.fixture(autouse=True)
def fresh_warnings(monkeypatch):
    monkeypatch.setattr(methods_base, "_WARNED_ALIASES", set())


@pytest.mark.parametrize("cls", [StoBatch, ResidualPerturbation, TransDenoiser], ids=lambda cls: cls.__name__)
def test_noise_seed_is_the_deprecated_name_of_seed_and_warns_once(cls):
    with pytest.warns(FutureWarning, match=rf"{cls.__name__}\(noise_seed=\.\.\.\) is deprecated: write seed=3"):
        old = build(cls, noise_seed=3)
    assert old.hparams["seed"] == 3 and "noise_seed" not in old.hparams
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        again = build(cls, noise_seed=3)  # once per class
        new = build(cls, seed=3)
    assert again.hparams["seed"] == new.hparams["seed"] == 3 and "noise_seed" not in new.hparams
    with pytest.raises(ValueError, match="seed=1 and noise_seed=2, one seed under two names"):
        build(cls, seed=1, noise_seed=2)


def test_a_checkpoint_saved_with_noise_seed_still_loads(tmp_path):
    module = build(ResidualPerturbation, seed=5, ensemble_size=1)
    hyper_parameters = dict(module.hparams)
    hyper_parameters["noise_seed"] = hyper_parameters.pop("seed")  # as a checkpoint written before the rename
    path = tmp_path / "old.ckpt"
    checkpoint = {CLASS_KEY: qualified_name(ResidualPerturbation), "hyper_parameters": hyper_parameters}
    torch.save({**checkpoint, "state_dict": module.state_dict()}, path)
    with pytest.warns(FutureWarning, match="noise_seed"):
        loaded = load_checkpoint_module(path)
    assert loaded.hparams["seed"] == 5 and "noise_seed" not in loaded.hparams
    for name, tensor in module.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], tensor), name


def test_a_config_naming_noise_seed_still_parses():
    with pytest.warns(FutureWarning, match="StoBatch\\(noise_seed=...\\)"):
        cli = build_recipe(
            CONFIG_DIR / "stobatch" / "digits.yaml", ["--trainer.logger=false", "--model.init_args.noise_seed=7"]
        )
    assert cli.model.hparams["seed"] == 7 and "noise_seed" not in cli.model.hparams


def test_dp_seed_is_the_deprecated_name_of_the_generative_modules_seed():
    """IGAMT and the EHR baselines (``GenerativeDPModule``): ``dp_seed`` warns once and is saved as ``seed``."""
    from tests.methods.igamt_helpers import small

    with pytest.warns(FutureWarning, match=r"IGAMT\(dp_seed=\.\.\.\) is deprecated: write seed=4"):
        old = small(noise_multiplier=1.0, dp_seed=4)
    new = small(noise_multiplier=1.0, seed=4)
    assert old.hparams["seed"] == new.hparams["seed"] == 4 and "dp_seed" not in old.hparams
    assert old.randomness.seed == new.randomness.seed == 4
    with pytest.raises(ValueError, match="seed=1 and dp_seed=2, one seed under two names"):
        small(noise_multiplier=1.0, seed=1, dp_seed=2)
