"""The private step cannot be bypassed: every optimizer step must apply exactly one unchanged private gradient."""

from __future__ import annotations

import pytest
import torch

from lightning_dprobust.callbacks import DPCallback
from lightning_dprobust.callbacks.dp_guard import PrivateStepBypassed, PrivateStepGuard
from lightning_dprobust.methods import DPSGD
from tests.helpers import digits, quiet_trainer

pytestmark = pytest.mark.usefixtures("dp_engine")  # each test on both engines (conftest.py)


class SkipsPrivateStep(DPSGD):
    """Returns the plain batch loss: no clipping, no noise."""

    def training_step(self, batch, batch_idx):
        return self.per_example_loss(*self.training_inputs(batch)).mean()


class AddsToPrivateStep(DPSGD):
    """Adds the raw batch loss to the private surrogate: its gradient leaks unclipped and unnoised."""

    def training_step(self, batch, batch_idx):
        inputs = self.training_inputs(batch)
        return self.private_step(inputs) + self.per_example_loss(*inputs).mean()


class TwoPrivateSteps(DPSGD):
    """Spends two private steps on one optimizer step."""

    def training_step(self, batch, batch_idx):
        inputs = self.training_inputs(batch)
        return self.private_step(inputs) + self.private_step(inputs)


@pytest.mark.parametrize(
    ("module_class", "message"),
    [
        (SkipsPrivateStep, "without private_step"),
        (AddsToPrivateStep, "not the private gradient"),
        (TwoPrivateSteps, "follows 2 private steps"),
    ],
)
def test_a_step_that_is_not_exactly_one_private_step_stops_the_run(tmp_path, module_class, message):
    module = module_class(model="cnn_tanh", num_classes=10, input_shape=(1, 8, 8))
    initial = [p.detach().clone() for p in module.parameters()]
    trainer = quiet_trainer(tmp_path, max_steps=2, callbacks=[DPCallback(noise_multiplier=1.0)])
    with pytest.raises(PrivateStepBypassed, match=message):
        trainer.fit(module, digits(batch_size=128))
    assert all(torch.equal(a, b) for a, b in zip(initial, module.parameters(), strict=True)), "a leaky step was applied"


def test_the_private_gradient_itself_passes_and_any_change_is_caught():
    parameter = torch.nn.Parameter(torch.zeros(3))
    guard = PrivateStepGuard()
    guard.record({"w": torch.tensor([1.0, 2.0, 3.0])})
    parameter.grad = torch.tensor([1.0, 2.0, 3.0])
    guard.verify({"w": parameter})
    guard.record({"w": torch.tensor([1.0, 2.0, 3.0])})
    parameter.grad = torch.tensor([1.0, 2.0, 3.0 + 1e-6])
    with pytest.raises(PrivateStepBypassed, match="not the private gradient"):
        guard.verify({"w": parameter})
