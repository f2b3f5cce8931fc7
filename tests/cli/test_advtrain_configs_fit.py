"""The adversarial-training configs of AIN's comparison fit end to end through ``DProbustCLI`` (as ``dprobust fit
--config``) on a tiny budget: the adversarial views come from the configured attack, and the DP ones report the
epsilon of the steps they took."""

from __future__ import annotations

import math
import re

import pytest

from lightning_dprobust import zoo
from lightning_dprobust.callbacks import AdversarialAugmentation
from lightning_dprobust.recipes import CONFIG_DIR, DProbustCLI, composed_config, find_dp_callback
from lightning_dprobust.robustness.ain_attack import AINAttack

CONFIGS = {
    "ain_advtrain": (AINAttack, False),
    "ain_advtrain_dp": (AINAttack, True),
    "ifgsm_advtrain_dp": ("BIM", True),
}
SUMMARY = re.compile(r"fit done: epsilon (?P<eps>[0-9.e+-]+) at delta 1e-05 \(rdp accountant\), (?P<steps>\d+) steps")


@pytest.mark.filterwarnings("ignore:LightningCLI's args parameter")
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_the_config_fits_and_a_dp_one_reports_its_epsilon(name, tmp_path, capsys):
    attack_class, private = CONFIGS[name]
    tiny = ["--trainer.max_epochs=1", "--trainer.limit_train_batches=2", "--trainer.limit_val_batches=1"]
    quiet = ["--trainer.logger=false", f"--trainer.default_root_dir={tmp_path}", "--trainer.enable_progress_bar=false"]
    cli = DProbustCLI(args=["fit", "--config", str(CONFIG_DIR / name / "digits.yaml"), *tiny, *quiet])
    (augmentation,) = [callback for callback in cli.trainer.callbacks if isinstance(callback, AdversarialAugmentation)]
    attack = augmentation.attack
    assert (
        (type(attack).__name__ == attack_class) if isinstance(attack_class, str) else isinstance(attack, attack_class)
    )
    assert attack.eps == pytest.approx(0.2) and augmentation.mode == "group"
    assert cli.trainer.global_step == 2
    summary = capsys.readouterr().out
    dp = find_dp_callback(cli.trainer)
    if not private:
        assert dp is None and "fit done: no DP (epsilon = inf)" in summary
        return
    found = SUMMARY.search(summary)
    assert found, summary[-2000:]
    epsilon = float(found["eps"])
    assert int(found["steps"]) == 2 and math.isclose(epsilon, dp.epsilon(), rel_tol=1e-3)
    assert 0 < epsilon <= 3.0 * 1.005  # never above the target the noise was calibrated for


def test_the_dp_configs_train_on_data_that_the_ain_and_its_target_never_saw():
    """The AIN is part of DP training: its guarantee about the private half needs a generator (and the classifier it
    was trained against) fitted on the public half only."""
    configs = {name: composed_config(CONFIG_DIR / name / "digits.yaml") for name in CONFIGS if "dp" in name}
    assert all(config["data"]["init_args"]["train_part"] == "private" for config in configs.values())
    (augmentation,) = [
        callback
        for callback in configs["ain_advtrain_dp"]["trainer"]["callbacks"]
        if callback["class_path"].endswith("AdversarialAugmentation")
    ]
    ain = zoo.info(augmentation["init_args"]["attack"]["init_args"]["ain"])
    target = zoo.info(ain.meta["classifier"])
    assert ain.meta["recipe"]["overrides"]["model.init_args.target"] == target.name
    for entry in (ain, target):
        assert entry.meta["recipe"]["overrides"]["data.init_args.train_part"] == "public", entry.name
