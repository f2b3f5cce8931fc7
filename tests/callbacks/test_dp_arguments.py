"""Arguments of ``DPCallback`` that were accepted silently and meant something else."""

from __future__ import annotations

import pytest
from lightning.pytorch.utilities.exceptions import MisconfigurationException

from lightning_dprobust.callbacks import DPCallback
from lightning_dprobust.methods import DPSGD
from tests.helpers import digits, quiet_trainer


@pytest.mark.parametrize("name", ["max_grad_norm", "noise_multiplier", "target_epsilon", "delta", "sample_rate"])
def test_a_boolean_is_not_a_number(name):
    arguments = {"noise_multiplier": 1.0} | {name: True}
    if name == "target_epsilon":
        arguments.pop("noise_multiplier")
    with pytest.raises(MisconfigurationException, match=f"{name}=True"):
        DPCallback(**arguments)


@pytest.mark.parametrize("value", ["no", "false", 0, None])
def test_poisson_sampling_must_be_a_boolean(value):
    with pytest.raises(MisconfigurationException, match="poisson_sampling=.* must be True or False"):
        DPCallback(noise_multiplier=1.0, poisson_sampling=value)


def test_a_callback_that_accounted_one_model_is_refused_for_another(tmp_path):
    callback = DPCallback(noise_multiplier=1.0)
    first = DPSGD(model="mlp_tanh", num_classes=10, input_shape=(1, 8, 8))
    quiet_trainer(tmp_path, max_steps=2, callbacks=[callback]).fit(first, digits())
    quiet_trainer(tmp_path, max_steps=3, callbacks=[callback]).fit(first, digits())  # the same model goes on
    assert callback.ledger.steps == 5
    second = DPSGD(model="mlp_tanh", num_classes=10, input_shape=(1, 8, 8))
    with pytest.raises(MisconfigurationException, match="already accounted 5 private steps of another model"):
        quiet_trainer(tmp_path, max_steps=2, callbacks=[callback]).fit(second, digits())
