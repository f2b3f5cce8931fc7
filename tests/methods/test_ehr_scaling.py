"""Scaling is part of the EHR mechanism (docs/design.md, contract 12): ranges read from the private training records are
refused under strict_dp and make the epsilon nominal otherwise; the DP line and the checkpoint name the privacy unit."""

from __future__ import annotations

import logging
import math

import pytest
from lightning.pytorch.utilities.exceptions import MisconfigurationException

from lightning_dprobust.data import EHRDataModule
from lightning_dprobust.methods.ehr_baselines import EHRVAE
from lightning_dprobust.methods.igamt import IGAMT
from tests.helpers import quiet_trainer

T = 4
SIZES = dict(d_model=16, heads=2, d_ff=32, noise_size=8, critic_hidden=16)


def data(scaling: str) -> EHRDataModule:
    return EHRDataModule(num_records=40, num_steps=T, batch_size=8, scaling=scaling)


def igamt(**kwargs) -> IGAMT:
    return IGAMT(max_steps=T, noise_multiplier=1.0, seed=1, synthetic_batch_size=4, **SIZES, **kwargs)


@pytest.mark.parametrize("make", [igamt, lambda: EHRVAE(max_steps=T, noise_multiplier=1.0, seed=1, **SIZES)])
def test_training_scaling_is_refused_under_strict_dp_in_one_line(make, tmp_path):
    module = make()
    with pytest.raises(MisconfigurationException, match=r"strict_dp=True.*scaling='public'") as error:
        quiet_trainer(tmp_path, max_epochs=1).fit(module, data("train"))
    assert "\n" not in str(error.value) and "'age'" in str(error.value)
    assert module.ledger.steps == 0


def test_without_strict_dp_training_scaling_makes_the_epsilon_nominal(tmp_path):
    module = igamt(strict_dp=False)
    quiet_trainer(tmp_path, max_epochs=1, limit_train_batches=2).fit(module, data("train"))
    assert module.epsilon() == math.inf and module.ledger.nominal
    assert "the epsilon excludes that cost" in module.nominal_reason()
    assert "excludes that cost" in module.privacy_summary() and module.nominal_epsilon() > 0


def test_public_scaling_keeps_the_guarantee_and_the_dp_line_names_the_privacy_unit(tmp_path, caplog):
    module = igamt()
    with caplog.at_level(logging.INFO):
        quiet_trainer(tmp_path, max_epochs=1, limit_train_batches=2).fit(module, data("public"))
    assert module.nominal_reason() is None and 0 < module.epsilon() < math.inf
    assert "privacy unit per record (one synthetic patient" in caplog.text
    assert "scaling ranges declared, public" in caplog.text
    assert module.ehr_schema["data_derived"] == () and module.ehr_schema["privacy_unit"].startswith("per record")
