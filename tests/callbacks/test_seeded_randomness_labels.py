"""A seeded ``DPCallback`` (reproducibility mode) is labelled as such wherever its privacy is reported: the console,
the logger (W&B config and summary) and the zoo record, and its seed is never logged as a harmless number."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
import torch
import yaml

from lightning_dprobust.callbacks import DPCallback
from lightning_dprobust.callbacks.dp_randomness import SECRET_LABEL, SEEDED_LABEL
from lightning_dprobust.callbacks.run import fit_summary, logged_parameters, report_fit
from lightning_dprobust.methods import DPSGD
from lightning_dprobust.zoo.build import privacy_record
from lightning_dprobust.zoo.catalog import CatalogError, Entry
from lightning_dprobust.zoo.hub import ZOO_DIR
from tests.helpers import digits, quiet_trainer


class WandbLogger:
    """Stands in for Lightning's ``WandbLogger`` (matched by class name): a run folder, summary and logged images."""

    def __init__(self, save_dir: str) -> None:
        self.save_dir = save_dir
        self.experiment = SimpleNamespace(summary={})
        self.images: list[str] = []

    def log_image(self, key: str, images: list[str]) -> None:
        self.images.append(key)


def fit(tmp_path, seed: int | None):
    """Two private steps of DP-SGD on digits; returns (trainer, callback)."""
    if seed is None:
        callback = DPCallback(max_grad_norm=1.0, noise_multiplier=1.0, delta=1e-5)
    else:
        with pytest.warns(UserWarning, match="reproducibility mode"):
            callback = DPCallback(max_grad_norm=1.0, noise_multiplier=1.0, delta=1e-5, seed=seed)
    trainer = quiet_trainer(tmp_path, max_steps=2, callbacks=[callback])
    torch.manual_seed(0)
    trainer.fit(DPSGD(model="mlp_tanh", num_classes=10, input_shape=(1, 8, 8), lr=0.1), digits(batch_size=64))
    return trainer, callback


def test_the_console_says_a_seeded_run_has_no_guarantee_against_whoever_holds_the_config(tmp_path, caplog):
    with caplog.at_level(logging.INFO):
        trainer, callback = fit(tmp_path / "seeded", seed=7)
    (start,) = [record.getMessage() for record in caplog.records if "randomness=" in record.getMessage()]
    assert start.endswith(f"randomness={SEEDED_LABEL}")
    assert f"2 steps, {SEEDED_LABEL}; " in fit_summary(trainer, callback)
    secret_trainer, secret = fit(tmp_path / "secret", seed=None)
    assert SEEDED_LABEL not in fit_summary(secret_trainer, secret) and secret.randomness.label == SECRET_LABEL


def test_the_logger_gets_the_label_in_its_config_and_summary_and_the_seed_with_its_warning(tmp_path, capsys):
    trainer, callback = fit(tmp_path, seed=7)
    config = {"dp": {"init_args": {"seed": 7, "max_grad_norm": 1.0}}, "data": {}, "seed_everything": 0}
    params = logged_parameters(config, callback)
    assert params["privacy"]["randomness_mode"] == SEEDED_LABEL
    assert params["dp"]["init_args"] == {"seed": f"7 ({SEEDED_LABEL})", "max_grad_norm": 1.0}
    assert config["dp"]["init_args"]["seed"] == 7  # the config itself is left as it was
    logger = WandbLogger(str(tmp_path))
    trainer.loggers = [logger]
    report_fit(trainer, callback)
    assert logger.experiment.summary["privacy/randomness_mode"] == SEEDED_LABEL
    assert SEEDED_LABEL in capsys.readouterr().out


def test_the_zoo_record_of_a_seeded_run_says_so_and_the_catalog_accepts_only_known_labels(tmp_path):
    _, callback = fit(tmp_path, seed=7)
    record = privacy_record(callback)
    assert record["randomness_mode"] == SEEDED_LABEL and 7 not in record.values()
    data = yaml.safe_load((ZOO_DIR / "entries" / "cnn_tanh.dpadv_cifar10_eps1.yaml").read_text())
    data["meta"]["privacy"] = record
    assert Entry.from_dict(data, data["name"]).meta["privacy"]["randomness_mode"] == SEEDED_LABEL
    data["meta"]["privacy"] = record | {"randomness_mode": "seeded"}
    with pytest.raises(CatalogError, match="meta.privacy.randomness_mode must be one of"):
        Entry.from_dict(data, data["name"])
