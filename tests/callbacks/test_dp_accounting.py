"""DPCallback's accountants: pld is the default, gdp never calibrates the noise or bounds a budget."""

from __future__ import annotations

import pytest
import torch
from lightning.pytorch.utilities.exceptions import MisconfigurationException

from lightning_dprobust.callbacks import DPCallback
from lightning_dprobust.core.accounting import PrivacyLedger
from lightning_dprobust.methods import DPSGD
from tests.helpers import digits, quiet_trainer

pytestmark = pytest.mark.usefixtures("dp_engine")  # each test on both engines (conftest.py)


def _dpsgd() -> DPSGD:
    torch.manual_seed(0)
    return DPSGD(model="mlp_tanh", model_kwargs={"hidden": 8}, num_classes=10, input_shape=(1, 8, 8))


def test_the_default_accountant_is_pld_and_its_epsilon_is_reported(tmp_path):
    callback = DPCallback(max_grad_norm=1.0, noise_multiplier=1.0, delta=1e-5)
    assert callback.accountant == "pld"
    quiet_trainer(tmp_path, max_steps=3, callbacks=[callback]).fit(_dpsgd(), digits(batch_size=128))
    ledger = PrivacyLedger(callback.ledger.history)
    assert 0 < callback.epsilon() == ledger.epsilon(1e-5, "pld") < ledger.epsilon(1e-5, "rdp")


@pytest.mark.parametrize("setting", [{"target_epsilon": 1.0}, {"noise_multiplier": 1.0, "epsilon_budget": 1.0}])
def test_gdp_cannot_calibrate_the_noise_or_bound_the_budget(tmp_path, setting):
    callback = DPCallback(max_grad_norm=1.0, delta=1e-5, accountant="gdp", **setting)
    trainer = quiet_trainer(tmp_path, max_epochs=1, callbacks=[callback])
    with pytest.raises((MisconfigurationException, ValueError), match="approximation.*pld.*prv.*rdp"):
        trainer.fit(_dpsgd(), digits(batch_size=128))
    assert callback.ledger.steps == 0
