"""DPCallback end to end on digits: noise scale, equivalence, calibration, budget, resume, refusals."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from torch import nn
from torch.utils.data import DataLoader, WeightedRandomSampler

from lightning_dprobust.callbacks import DPCallback, StopReason
from lightning_dprobust.callbacks.dp_checks import check_trainer
from lightning_dprobust.core.accounting import PrivacyLedger
from lightning_dprobust.methods import DPSGD
from tests.helpers import GradientRecorder, ZeroGradient, digits, quiet_trainer

pytestmark = pytest.mark.usefixtures("dp_engine")  # each test on both engines (conftest.py)

N_TRAIN = 1293


def dpsgd(**kwargs) -> DPSGD:
    torch.manual_seed(0)
    return DPSGD(model="cnn_tanh", num_classes=10, input_shape=(1, 8, 8), lr=0.5, **kwargs)


@pytest.mark.parametrize(("noise_multiplier", "max_grad_norm"), [(1.0, 1.0), (2.0, 0.5)])
def test_noise_on_the_sum_has_std_noise_multiplier_times_clip(tmp_path, noise_multiplier, max_grad_norm):
    recorder = GradientRecorder()
    callback = DPCallback(max_grad_norm=max_grad_norm, noise_multiplier=noise_multiplier, delta=1e-5)
    trainer = quiet_trainer(tmp_path, max_steps=3, callbacks=[callback, recorder])
    trainer.fit(ZeroGradient(model="cnn_tanh", num_classes=10, input_shape=(1, 8, 8)), digits(batch_size=128))
    expected_batch = callback.loaders.sample_rate * N_TRAIN
    noise_on_sum = torch.cat(recorder.grads) * expected_batch
    assert noise_on_sum.mean().abs() < 0.05 * noise_multiplier * max_grad_norm
    assert noise_on_sum.std().item() == pytest.approx(noise_multiplier * max_grad_norm, rel=0.03)


def test_zero_noise_huge_clip_fixed_batches_equals_non_private_training(tmp_path):
    data = digits(batch_size=64)
    data.setup()
    subset = torch.utils.data.Subset(data.train_set, range(1280))

    def fixed() -> DataLoader:  # the same shuffled batches each time it is called
        return DataLoader(subset, batch_size=64, shuffle=True, generator=torch.Generator().manual_seed(0))

    private, plain = dpsgd(), dpsgd()
    callback = DPCallback(max_grad_norm=1e9, noise_multiplier=0.0, poisson_sampling=False)
    with pytest.warns(UserWarning, match="approximation"):
        quiet_trainer(tmp_path, max_epochs=1, callbacks=[callback]).fit(private, train_dataloaders=fixed())
    quiet_trainer(tmp_path, max_epochs=1).fit(plain, train_dataloaders=fixed())
    for a, b in zip(private.parameters(), plain.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    assert math.isinf(callback.epsilon())


def test_target_epsilon_is_met_within_one_percent_and_never_exceeded(tmp_path):
    callback = DPCallback(max_grad_norm=1.0, target_epsilon=2.0, delta=1e-5)
    trainer = quiet_trainer(tmp_path, max_epochs=3, callbacks=[callback])
    trainer.fit(dpsgd(), digits(batch_size=128))
    spent = callback.epsilon()
    assert 0.99 * 2.0 <= spent <= 2.0
    assert trainer.global_step == 3 * callback.loaders.steps_per_epoch == callback.ledger.steps


def test_epsilon_budget_stops_training_before_it_is_exceeded(tmp_path):
    callback = DPCallback(max_grad_norm=1.0, noise_multiplier=1.5, epsilon_budget=2.0, delta=1e-5)
    trainer = quiet_trainer(tmp_path, max_epochs=50, callbacks=[callback])
    trainer.fit(dpsgd(), digits(batch_size=128))
    assert callback.stop_reason is StopReason.BUDGET_EXHAUSTED
    assert callback.epsilon() <= 2.0
    one_more = PrivacyLedger(callback.ledger.history)
    one_more.record(1.5, callback.loaders.sample_rate)
    assert one_more.epsilon(1e-5) > 2.0
    assert trainer.global_step < 50 * callback.loaders.steps_per_epoch


def test_epsilon_is_logged_each_epoch(tmp_path):
    callback = DPCallback(max_grad_norm=1.0, noise_multiplier=1.0, delta=1e-5)
    trainer = quiet_trainer(tmp_path, max_epochs=2, callbacks=[callback])
    trainer.fit(dpsgd(), digits(batch_size=128))
    logged = trainer.callback_metrics["privacy/epsilon"].item()
    assert logged == pytest.approx(callback.epsilon(), rel=1e-6)
    assert logged == pytest.approx(PrivacyLedger(callback.ledger.history).epsilon(1e-5), rel=1e-6)


def test_resume_reports_the_same_epsilon_as_an_uninterrupted_run(tmp_path):
    def run(epochs, ckpt_path=None, checkpoint=None):
        callback = DPCallback(max_grad_norm=1.0, noise_multiplier=1.1, delta=1e-5)
        callbacks = [callback] + ([checkpoint] if checkpoint else [])
        trainer = quiet_trainer(tmp_path, max_epochs=epochs, callbacks=callbacks, enable_checkpointing=bool(checkpoint))
        trainer.fit(dpsgd(), digits(batch_size=128), ckpt_path=ckpt_path)
        return callback

    checkpoint = ModelCheckpoint(dirpath=tmp_path / "ckpt", save_last=True)
    first = run(2, checkpoint=checkpoint)
    saved = torch.load(tmp_path / "ckpt" / "last.ckpt", weights_only=True)
    assert saved["callbacks"]["DPCallback"]["ledger"] == first.ledger.state_dict()
    resumed = run(4, ckpt_path=tmp_path / "ckpt" / "last.ckpt")
    uninterrupted = run(4)
    assert resumed.ledger.steps == uninterrupted.ledger.steps == 4 * uninterrupted.loaders.steps_per_epoch
    assert resumed.epsilon() == uninterrupted.epsilon()


def test_resume_with_a_different_clip_is_refused(tmp_path):
    checkpoint = ModelCheckpoint(dirpath=tmp_path / "ckpt", save_last=True)
    callback = DPCallback(max_grad_norm=1.0, noise_multiplier=1.0)
    quiet_trainer(tmp_path, max_epochs=1, callbacks=[callback, checkpoint], enable_checkpointing=True).fit(
        dpsgd(), digits(batch_size=128)
    )
    other = DPCallback(max_grad_norm=2.0, noise_multiplier=1.0)
    with pytest.raises(MisconfigurationException, match="max_grad_norm"):
        quiet_trainer(tmp_path, max_epochs=2, callbacks=[other]).fit(
            dpsgd(), digits(batch_size=128), ckpt_path=tmp_path / "ckpt" / "last.ckpt"
        )


# ------------------------------------------------------------------------------------------------ refusals
class RenormalizedEmbedding(nn.Module):
    """A pixel-intensity embedding with ``max_norm``: each forward renormalizes the rows it looks up, in place."""

    def __init__(self):
        super().__init__()
        self.table = nn.Embedding(17, 4, max_norm=1.0)
        self.head = nn.Linear(64 * 4, 10)

    def forward(self, x):
        return self.head(self.table(x.flatten(1).long()).flatten(1))


class TwoOptimizers(DPSGD):
    def configure_optimizers(self):
        return [torch.optim.SGD(self.parameters(), lr=0.1), torch.optim.SGD(self.parameters(), lr=0.1)]


@pytest.mark.parametrize(
    ("module", "trainer_kwargs", "message"),
    [
        (lambda: dpsgd(), {"accumulate_grad_batches": 2}, "accumulate_grad_batches"),
        (lambda: dpsgd(), {"gradient_clip_val": 1.0}, "gradient_clip_val"),
        (
            lambda: DPSGD(model=nn.Sequential(nn.Flatten(), nn.Linear(64, 8), nn.BatchNorm1d(8), nn.Linear(8, 10))),
            {},
            "BatchNorm",
        ),
        (lambda: TwoOptimizers(model="cnn_tanh", input_shape=(1, 8, 8)), {}, "exactly one optimizer"),
        (lambda: DPSGD(model=RenormalizedEmbedding()), {}, "max_norm=1.0: it renormalizes the rows"),
    ],
)
def test_setups_that_break_the_guarantee_are_refused(tmp_path, module, trainer_kwargs, message):
    callback = DPCallback(max_grad_norm=1.0, noise_multiplier=1.0)
    trainer = quiet_trainer(tmp_path, max_epochs=1, callbacks=[callback], **trainer_kwargs)
    with pytest.raises(MisconfigurationException, match=message):
        trainer.fit(module(), digits())


class ManualOptimization(DPSGD):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.automatic_optimization = False


def test_manual_optimization_is_refused(tmp_path):
    callback = DPCallback(max_grad_norm=1.0, noise_multiplier=1.0)
    with pytest.raises(MisconfigurationException, match="automatic optimization"):
        quiet_trainer(tmp_path, max_epochs=1, callbacks=[callback]).fit(ManualOptimization(), digits())


def test_fp16_mixed_precision_is_refused(tmp_path):
    # On CPU Lightning turns "16-mixed" into bf16, so the fp16 check is exercised on a trainer stand-in.
    trainer = SimpleNamespace(
        accumulate_grad_batches=1,
        precision="16-mixed",
        gradient_clip_val=None,
        _accelerator_connector=SimpleNamespace(is_distributed=False, use_distributed_sampler=True),
    )
    with pytest.raises(MisconfigurationException, match="precision"):
        check_trainer(trainer, poisson_sampling=True)


def test_ddp_with_lightning_distributed_sampler_is_refused():
    trainer = SimpleNamespace(
        accumulate_grad_batches=1,
        precision="32-true",
        gradient_clip_val=None,
        _accelerator_connector=SimpleNamespace(is_distributed=True, use_distributed_sampler=True),
    )
    with pytest.raises(MisconfigurationException, match="use_distributed_sampler=False"):
        check_trainer(trainer, poisson_sampling=True)


class WeightedData(type(digits())):
    def train_dataloader(self):
        weights = torch.ones(len(self.train_set))
        return DataLoader(self.train_set, batch_size=64, sampler=WeightedRandomSampler(weights, len(weights)))


def test_a_loader_with_a_custom_sampler_is_refused(tmp_path):
    callback = DPCallback(max_grad_norm=1.0, noise_multiplier=1.0)
    with pytest.raises(MisconfigurationException, match="WeightedRandomSampler"):
        quiet_trainer(tmp_path, max_epochs=1, callbacks=[callback]).fit(dpsgd(), WeightedData())


def test_a_loader_passed_directly_is_refused_without_the_opt_out(tmp_path):
    data = digits()
    data.setup()
    callback = DPCallback(max_grad_norm=1.0, noise_multiplier=1.0)
    with pytest.raises(MisconfigurationException, match="not built by DPCallback"):
        quiet_trainer(tmp_path, max_epochs=1, callbacks=[callback]).fit(
            dpsgd(), train_dataloaders=DataLoader(data.train_set, batch_size=64)
        )


def test_unreachable_target_epsilon_is_refused_with_the_key_and_the_fix(tmp_path):
    callback = DPCallback(max_grad_norm=1.0, target_epsilon=1e-6, delta=1e-5)
    with pytest.raises(MisconfigurationException, match="target_epsilon"):
        quiet_trainer(tmp_path, max_epochs=1, callbacks=[callback]).fit(dpsgd(), digits())


def test_delta_above_one_over_n_is_refused(tmp_path):
    callback = DPCallback(max_grad_norm=1.0, noise_multiplier=1.0, delta=0.01)
    with pytest.raises(MisconfigurationException, match="delta"):
        quiet_trainer(tmp_path, max_epochs=1, callbacks=[callback]).fit(dpsgd(), digits())


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"noise_multiplier": -1.0}, "noise_multiplier"),
        ({"noise_multiplier": float("nan")}, "noise_multiplier"),
        ({"noise_multiplier": float("inf")}, "noise_multiplier"),
        ({"noise_multiplier": 1.0, "max_grad_norm": 0.0}, "max_grad_norm"),
        ({"noise_multiplier": 1.0, "target_epsilon": 3.0}, "exactly one"),
        ({}, "exactly one"),
        ({"noise_multiplier": 1.0, "delta": 1.0}, "delta"),
        ({"noise_multiplier": 1.0, "sample_rate": 1.5}, "sample_rate"),
        ({"noise_multiplier": 1.0, "accountant": "moments"}, "accountant"),
        ({"target_epsilon": -3.0}, "target_epsilon"),
        ({"noise_multiplier": 1.0, "seed": -1}, "seed"),
        ({"noise_multiplier": 1.0, "seed": "0"}, "seed"),
    ],
)
def test_bad_arguments_are_refused_with_their_name(kwargs, message):
    with pytest.raises(MisconfigurationException, match=message):
        DPCallback(**kwargs)


def test_default_delta_is_one_over_ten_n_rounded_down(tmp_path):
    callback = DPCallback(max_grad_norm=1.0, noise_multiplier=1.0)
    quiet_trainer(tmp_path, max_steps=1, callbacks=[callback]).fit(dpsgd(), digits())
    assert callback.delta == 1e-5  # 1 / (10 * 1293) = 7.7e-5 -> 1e-5


def test_the_module_trains_without_the_callback_and_is_restored_after_fit(tmp_path):
    module = dpsgd()
    quiet_trainer(tmp_path, max_steps=2, callbacks=[DPCallback(noise_multiplier=1.0)]).fit(module, digits())
    assert module.private_step is None
    quiet_trainer(tmp_path, max_steps=2).fit(module, digits())


class SharedStem(nn.Module):
    """A layer held under two names, the model's and its block's (as CoaT's position encodings)."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(1, 4, 3, padding=1)
        self.block = nn.Sequential(self.stem, nn.Tanh())
        self.head = nn.Linear(4 * 64, 10)

    def forward(self, x):
        return self.head(self.block(x).flatten(1))


def test_a_layer_under_two_names_stays_the_models_and_trains(tmp_path):
    """The vmap engine used to leave such a layer holding functorch tensors after one step: the optimizer then stepped
    parameters the model no longer used, and the layer stopped training."""
    torch.manual_seed(0)
    module = DPSGD(model=SharedStem(), num_classes=10, input_shape=(1, 8, 8), lr=0.5)
    held = dict(module.named_parameters(remove_duplicate=False))
    before = module.model.stem.weight.detach().clone()
    callback = DPCallback(max_grad_norm=1.0, noise_multiplier=0.5, delta=1e-5)
    quiet_trainer(tmp_path, max_steps=3, callbacks=[callback]).fit(module, digits(batch_size=64))
    assert dict(module.named_parameters(remove_duplicate=False)) == held
    assert not any(torch._C._functorch.is_functorch_wrapped_tensor(p) for p in held.values())
    assert module.model.block[0] is module.model.stem
    assert not torch.equal(module.model.stem.weight, before)
