"""``dprobust audit --attack salem`` on a residual-perturbation ensemble checkpoint, end to end on digits."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

from lightning_dprobust.audit import runner, salem_attack
from lightning_dprobust.audit.salem import SalemSplit
from lightning_dprobust.cli import main
from lightning_dprobust.cli.audit import format_salem_report
from lightning_dprobust.methods import ResidualPerturbation
from tests.helpers import digits, quiet_trainer


def test_salem_audit_of_an_ensemble_checkpoint_trains_one_shadow_like_it(tmp_path, monkeypatch, capsys):
    torch.manual_seed(0)
    data = digits(batch_size=128)
    module = ResidualPerturbation(
        gamma=0.6, ensemble_size=2, num_classes=10, input_shape=(1, 8, 8), mean=data.mean, std=data.std
    )
    trainer = quiet_trainer(tmp_path, max_epochs=1, limit_train_batches=2)
    trainer.fit(module, data)
    trainer.save_checkpoint(tmp_path / "rp.ckpt")
    shadows = []

    def recording(*args, **kwargs):
        shadows.append(train_classifier(*args, **kwargs).module)
        return runner.TrainedModel(shadows[-1], float("inf"), None)

    train_classifier = runner.train_classifier
    monkeypatch.setattr(runner, "train_classifier", recording)
    out = tmp_path / "audit"
    argv = ["audit", "--ckpt_path", str(tmp_path / "rp.ckpt"), "--attack", "salem", "--epochs", "1", "--out", str(out)]
    assert main([*argv, "--no-wandb"]) == 0
    printed = capsys.readouterr().out
    [shadow] = shadows
    assert isinstance(shadow, ResidualPerturbation) and len(shadow.model.net.members) == 2
    assert (shadow.hparams.gamma, shadow.hparams.strategy) == (0.6, "additive")
    assert "D_target is 504 members vs 504 non-members" in printed
    assert "trained like the target on 394 examples, 394 held out" in printed
    auc = float(re.search(r"\| salem \| ([0-9.]+) \|", printed).group(1))
    assert 0.0 <= auc <= 1.0
    written = (out / "audit.md").read_text()
    assert all(f"| {t} | " in written for t in ("0.5", "0.6", "0.7", "0.8"))
    assert "| loss |" not in written and (out / "roc.png").stat().st_size > 0


def test_a_collapsed_attack_is_reported_as_no_signal_not_as_privacy():
    constant = torch.tensor([[2.0, 1.0, 0.0]]).repeat(50, 1)
    report = salem_attack((constant, constant), (constant, constant), epochs=1)
    split = SalemSplit(*(np.arange(50) + 50 * i for i in range(4)))
    assert report.collapsed and "found no signal, not that the model is private" in format_salem_report(report, split)


@pytest.mark.parametrize("value", ["0", "-0.1", "nan"])
def test_bad_salem_lr_exits_2_in_one_line(value, tmp_path, capsys):
    argv = ["audit", "--ckpt_path", "x.ckpt", "--attack", "salem", "--salem_lr", value, "--out", str(tmp_path)]
    assert main([*argv, "--no-wandb"]) == 2
    error = capsys.readouterr().err
    assert error.startswith("dprobust: error: --salem_lr must be > 0") and error.count("\n") == 1
