"""The private step cannot be bypassed: every optimizer step must apply exactly one unchanged private gradient."""

from __future__ import annotations

import lightning as L
import pytest
import torch
from lightning.pytorch.utilities.exceptions import MisconfigurationException

from lightning_dprobust.callbacks import DPCallback
from lightning_dprobust.callbacks.dp_guard import (
    BuffersWritten,
    ClosureReplayed,
    PrivateStepBypassed,
    PrivateStepGuard,
)
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


def test_a_hand_over_sets_grad_to_the_private_tensor_and_refuses_any_gradient_already_there():
    parameter = torch.nn.Parameter(torch.zeros(3))
    private = {"w": torch.tensor([1.0, 2.0, 3.0])}
    guard = PrivateStepGuard()
    loss = guard.release({"w": parameter}, private, hand_over=True)
    loss.backward()
    assert parameter.grad is None, "the hand-over loss reached the parameter"
    guard.verify({"w": parameter})
    assert parameter.grad is private["w"]
    guard.release({"w": parameter}, {"w": torch.tensor([1.0, 2.0, 3.0])}, hand_over=True)
    parameter.grad = torch.zeros(3)  # a hook wrote a gradient, even an all-zero one
    with pytest.raises(PrivateStepBypassed, match=r"\['w'\] received a gradient outside private_step"):
        guard.verify({"w": parameter})


class SeesGradients(L.Callback):
    """Records ``.grad`` of the first parameter where a hook sees it, and the value the optimizer applied."""

    def __init__(self) -> None:
        self.before_update, self.applied, self.after_update = [], [], []

    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        self.before_update.append(next(pl_module.parameters()).grad)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.weights = next(pl_module.parameters()).detach().clone()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        parameter = next(pl_module.parameters())
        self.applied.append((self.weights - parameter.detach()) / trainer.optimizers[0].param_groups[0]["lr"])
        self.after_update.append(parameter.grad)


def test_in_one_process_the_optimizer_applies_the_handed_over_private_gradient(tmp_path, monkeypatch):
    released = []
    original = PrivateStepGuard.release

    def spy(self, parameters, private, hand_over):
        released.append((dict(private), hand_over))
        return original(self, parameters, private, hand_over)

    monkeypatch.setattr(PrivateStepGuard, "release", spy)
    module = DPSGD(model="cnn_tanh", num_classes=10, input_shape=(1, 8, 8), optimizer="sgd", lr=0.5)
    seen = SeesGradients()
    trainer = quiet_trainer(tmp_path, max_steps=2, callbacks=[DPCallback(noise_multiplier=1.0), seen])
    trainer.fit(module, digits(batch_size=128))
    assert [hand_over for _, hand_over in released] == [True, True]
    assert seen.before_update == [None, None], "a hook saw a gradient before the hand-over"
    first = next(iter(released[0][0]))
    for (private, _), grad, applied in zip(released, seen.after_update, seen.applied, strict=True):
        assert grad is private[first], "the optimizer's .grad is not the released tensor"
        torch.testing.assert_close(applied, private[first], rtol=1e-5, atol=1e-6)


class RawGradientAdder(L.Callback):
    """A callback placed after ``DPCallback`` that adds the raw batch gradient to ``.grad`` before the update."""

    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        _add_raw_gradient(pl_module)


def _add_raw_gradient(module) -> None:
    x, y = module._last_batch
    with torch.enable_grad():
        grads = torch.autograd.grad(module.per_example_loss(x, y).mean(), list(module.parameters()))
    for p, g in zip(module.parameters(), grads, strict=True):
        p.grad = g if p.grad is None else p.grad + g


class RemembersBatch(DPSGD):
    def training_inputs(self, batch):
        self._last_batch = batch
        return super().training_inputs(batch)


class LateModuleHook(RemembersBatch):
    def on_before_optimizer_step(self, optimizer):
        _add_raw_gradient(self)


class LateClipping(RemembersBatch):
    def configure_gradient_clipping(self, optimizer, gradient_clip_val=None, gradient_clip_algorithm=None):
        _add_raw_gradient(self)


class LeakyPrecision(L.pytorch.plugins.precision.Precision):
    """A precision plugin whose wrapped closure adds the raw gradient after the closure ran."""

    def _wrap_closure(self, model, optimizer, closure):
        result = super()._wrap_closure(model, optimizer, closure)
        _add_raw_gradient(model)
        return result


@pytest.mark.parametrize(
    ("module_class", "extra"),
    [
        (RemembersBatch, {"callbacks": [RawGradientAdder()]}),
        (LateModuleHook, {}),
        (LateClipping, {}),
        (RemembersBatch, {"plugins": [LeakyPrecision()]}),
    ],
    ids=["callback after DPCallback", "module hook", "configure_gradient_clipping", "precision plugin"],
)
def test_a_gradient_changed_after_the_private_step_by_a_late_hook_stops_the_run(tmp_path, module_class, extra):
    module = module_class(model="cnn_tanh", num_classes=10, input_shape=(1, 8, 8))
    initial = [p.detach().clone() for p in module.parameters()]
    callbacks = [DPCallback(noise_multiplier=1.0), *extra.get("callbacks", [])]
    trainer = quiet_trainer(tmp_path, max_steps=2, callbacks=callbacks, plugins=extra.get("plugins"))
    with pytest.raises(PrivateStepBypassed, match="not the private gradient"):
        trainer.fit(module, digits(batch_size=128))
    assert all(torch.equal(a, b) for a, b in zip(initial, module.parameters(), strict=True)), "a leaky step was applied"


class ForeignTensorInOptimizer(DPSGD):
    """Puts a ``requires_grad`` buffer into the optimizer: it would be trained outside the private step."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.register_buffer("extra", torch.zeros(3, requires_grad=True))

    def configure_optimizers(self):
        return torch.optim.SGD([*self.parameters(), self.extra], lr=0.1)


def test_a_tensor_in_the_optimizer_that_the_private_step_does_not_cover_stops_the_run(tmp_path):
    module = ForeignTensorInOptimizer(model="cnn_tanh", num_classes=10, input_shape=(1, 8, 8))
    trainer = quiet_trainer(tmp_path, max_steps=1, callbacks=[DPCallback(noise_multiplier=1.0)])
    with pytest.raises(PrivateStepBypassed, match="not a trainable parameter of the module"):
        trainer.fit(module, digits(batch_size=128))


class WithLBFGS(DPSGD):
    def configure_optimizers(self):
        return torch.optim.LBFGS(self.parameters(), lr=0.1, max_iter=5)


class ReplaysClosure(torch.optim.SGD):
    """Calls its closure twice per step, as a line search would."""

    def step(self, closure=None):
        closure()
        return super().step(closure)


class WithReplayingOptimizer(DPSGD):
    def configure_optimizers(self):
        return ReplaysClosure(self.parameters(), lr=0.1)


def test_lbfgs_is_refused_and_a_replayed_closure_stops_before_its_second_release(tmp_path):
    trainer = quiet_trainer(tmp_path, max_steps=1, callbacks=[DPCallback(noise_multiplier=1.0)])
    with pytest.raises(MisconfigurationException, match="LBFGS evaluates the loss several times"):
        trainer.fit(WithLBFGS(model="cnn_tanh", num_classes=10, input_shape=(1, 8, 8)), digits(batch_size=128))
    callback = DPCallback(noise_multiplier=1.0)
    trainer = quiet_trainer(tmp_path, max_steps=1, callbacks=[callback])
    with pytest.raises(ClosureReplayed, match="called its closure a second time"):
        trainer.fit(WithReplayingOptimizer(model="cnn_tanh", num_classes=10, input_shape=(1, 8, 8)), digits(128))
    assert callback.ledger.steps == 1  # the second call raised before it released anything


class WritesABuffer(DPSGD):
    """Writes a statistic of the private batch into a buffer during the training step."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.register_buffer("seen_mean", torch.zeros(()))

    def training_inputs(self, batch):
        self.seen_mean.copy_(batch[0].mean())
        return super().training_inputs(batch)


def test_a_buffer_written_by_a_training_step_stops_the_run_and_is_restored(tmp_path):
    module = WritesABuffer(model="cnn_tanh", num_classes=10, input_shape=(1, 8, 8))
    initial = [p.detach().clone() for p in module.parameters()]
    trainer = quiet_trainer(tmp_path, max_steps=2, callbacks=[DPCallback(noise_multiplier=1.0)])
    with pytest.raises(BuffersWritten, match="seen_mean"):
        trainer.fit(module, digits(batch_size=128))
    assert float(module.seen_mean) == 0.0
    assert all(torch.equal(a, b) for a, b in zip(initial, module.parameters(), strict=True))


def test_a_running_statistics_layer_is_refused_and_its_buffers_stay_unwritten(tmp_path):
    from lightning_dprobust.audit.sensitivity import FunctionalBatchNorm, _classifier

    module = DPSGD(model=_classifier(FunctionalBatchNorm()), num_classes=10, input_shape=(1, 8, 8))
    trainer = quiet_trainer(tmp_path, max_steps=2, callbacks=[DPCallback(noise_multiplier=1.0)])
    with pytest.raises(Exception, match="cannot|buffers|Expected more than 1 value"):
        trainer.fit(module, digits(batch_size=128))
    norm = module.model[3]
    assert torch.equal(norm.running_mean, torch.zeros_like(norm.running_mean))
    assert torch.equal(norm.running_var, torch.ones_like(norm.running_var))
