"""``dprobust audit --attack salem`` on a residual-perturbation ensemble checkpoint, end to end on digits."""

from __future__ import annotations

import re

import torch

from lightning_dprobust.audit import runner
from lightning_dprobust.cli import main
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
    argv = ["audit", "--ckpt", str(tmp_path / "rp.ckpt"), "--attack", "salem", "--epochs", "1", "--out", str(out)]
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
