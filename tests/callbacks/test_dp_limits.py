"""Privacy limits DPCallback must hold: targets never exceeded, resumes accounted, unsound setups refused."""

from __future__ import annotations

import logging

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import GradientAccumulationScheduler, ModelCheckpoint
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from torch.utils.data import DataLoader, RandomSampler, Subset, WeightedRandomSampler

from lightning_dprobust.callbacks import DPCallback, StopReason
from lightning_dprobust.core.accounting import PrivacyLedger
from lightning_dprobust.methods import DPSGD
from tests.helpers import digits, quiet_trainer

pytestmark = pytest.mark.usefixtures("dp_engine")  # each test on both engines (conftest.py)

CKPT = "ckpt/last.ckpt"


def dpsgd() -> DPSGD:
    return DPSGD(model="cnn_tanh", num_classes=10, input_shape=(1, 8, 8), lr=0.5)


def fit(tmp_path, callback, ckpt_path=None, save=False, module=None, data=None, **trainer_kwargs) -> L.Trainer:
    """Fit on digits (batch 256: 5 Poisson steps per epoch); ``save`` writes ``ckpt/last.ckpt``."""
    callbacks = [callback] if callback is not None else []
    if save:
        callbacks.append(ModelCheckpoint(dirpath=tmp_path / "ckpt", save_last=True))
    trainer = quiet_trainer(tmp_path, callbacks=callbacks, enable_checkpointing=save, **trainer_kwargs)
    trainer.fit(module or dpsgd(), data or digits(batch_size=256), ckpt_path=ckpt_path)
    return trainer


# ------------------------------------------------------------------------------------------ targets and resumes
def test_a_resume_with_more_epochs_recalibrates_and_stays_within_the_target(tmp_path):
    fit(tmp_path, DPCallback(target_epsilon=2.0, delta=1e-5), save=True, max_epochs=1)
    resumed = DPCallback(target_epsilon=2.0, delta=1e-5)
    fit(tmp_path, resumed, ckpt_path=tmp_path / CKPT, max_epochs=2)
    assert resumed.ledger.steps == 10
    assert resumed.epsilon() <= 2.0
    assert len(resumed.ledger.history) == 2, "the remaining steps were not recalibrated"


def test_a_resume_under_a_target_calibrates_the_remaining_steps_against_the_ledger(tmp_path):
    fit(tmp_path, DPCallback(noise_multiplier=1.8, delta=1e-5), save=True, max_epochs=1)
    resumed = DPCallback(target_epsilon=2.0, delta=1e-5)
    with pytest.warns(UserWarning, match="composes both"):
        fit(tmp_path, resumed, ckpt_path=tmp_path / CKPT, max_epochs=3)
    assert resumed.ledger.history[0].noise_multiplier == 1.8
    assert 0.99 * 2.0 <= resumed.epsilon() <= 2.0


def test_a_resume_with_another_noise_multiplier_records_it_in_the_ledger(tmp_path):
    fit(tmp_path, DPCallback(noise_multiplier=1.0, delta=1e-5), save=True, max_epochs=1)
    resumed = DPCallback(noise_multiplier=2.0, delta=1e-5)
    with pytest.warns(UserWarning, match="composes both"):
        fit(tmp_path, resumed, ckpt_path=tmp_path / CKPT, max_epochs=2)
    rate = resumed.loaders.sample_rate
    assert [tuple(event) for event in resumed.ledger.state_dict()["history"]] == [(1.0, rate, 5), (2.0, rate, 5)]


def test_a_checkpoint_with_tiny_noise_is_refused_under_a_target(tmp_path):
    fit(tmp_path, DPCallback(noise_multiplier=1e-4, delta=1e-5), save=True, max_steps=2)
    with pytest.raises(MisconfigurationException, match="already spent"):
        fit(tmp_path, DPCallback(target_epsilon=3.0, delta=1e-5), ckpt_path=tmp_path / CKPT, max_steps=4)


def test_a_checkpoint_without_a_dp_ledger_is_refused(tmp_path):
    fit(tmp_path, None, save=True, max_steps=3)
    with pytest.raises(MisconfigurationException, match="no DP ledger"):
        fit(tmp_path, DPCallback(noise_multiplier=1.0), ckpt_path=tmp_path / CKPT, max_steps=6)


def test_accumulation_switched_on_during_fit_is_refused(tmp_path):
    scheduler = GradientAccumulationScheduler(scheduling={1: 2})
    callback = DPCallback(target_epsilon=1.0, delta=1e-5)
    trainer = quiet_trainer(tmp_path, max_epochs=3, callbacks=[callback, scheduler])
    with pytest.raises(MisconfigurationException, match="GradientAccumulationScheduler"):
        trainer.fit(dpsgd(), digits(batch_size=256))
    assert callback.epsilon() <= 1.0


def test_calibration_counts_limit_train_batches(tmp_path):
    callback = DPCallback(target_epsilon=2.0, delta=1e-5)
    fit(tmp_path, callback, max_epochs=2, limit_train_batches=2)
    assert callback.ledger.steps == 4
    assert 0.99 * 2.0 <= callback.epsilon() <= 2.0


def test_min_epochs_with_an_epsilon_budget_stops_cleanly_within_the_budget(tmp_path):
    callback = DPCallback(noise_multiplier=1.5, epsilon_budget=3.0, delta=1e-5)
    trainer = fit(tmp_path, callback, min_epochs=20, max_epochs=30)
    assert callback.stop_reason is StopReason.BUDGET_EXHAUSTED
    assert 0 < callback.epsilon() <= 3.0
    assert trainer.current_epoch < 20


# ------------------------------------------------------------------------------------------------- refusals
class ShuffledData(type(digits())):
    def __init__(self, sampler, **kwargs):
        super().__init__(batch_size=64, **kwargs)
        self.make_sampler = sampler

    def train_dataloader(self):
        return DataLoader(self.train_set, batch_size=64, sampler=self.make_sampler(self.train_set))


@pytest.mark.parametrize(
    "sampler",
    [
        lambda data: WeightedRandomSampler(torch.ones(len(data)), len(data)),
        lambda data: RandomSampler(data, replacement=True),
        lambda data: RandomSampler(data, num_samples=2 * len(data)),
    ],
    ids=["weighted", "with-replacement", "num-samples"],
)
def test_without_poisson_sampling_only_a_uniform_shuffle_is_accepted(tmp_path, sampler):
    callback = DPCallback(noise_multiplier=1.0, poisson_sampling=False)
    with pytest.raises(MisconfigurationException, match="uniform shuffle without replacement"):
        fit(tmp_path, callback, data=ShuffledData(sampler), max_steps=1)


def test_bf16_mixed_precision_trains_with_either_engine(tmp_path):
    """Allowed: the vmap engine's norms and sum come from the same per-example gradients, and the ghost engine runs its
    private step in float32 (``core/test_ghost_precision.py``); under bf16 its first-step check refused the CNN."""
    callback = DPCallback(noise_multiplier=1.0)
    trainer = fit(tmp_path, callback, precision="bf16-mixed", max_steps=2)
    assert trainer.global_step == 2 and 0 < callback.epsilon() < float("inf")


def test_bf16_true_precision_is_refused(tmp_path):
    with pytest.raises(MisconfigurationException, match="bf16-true"):
        fit(tmp_path, DPCallback(noise_multiplier=1.0), precision="bf16-true", max_steps=1)


class TinyData(type(digits())):
    def setup(self, stage=None):
        super().setup(stage)
        self.train_set = Subset(self.train_set, range(5))


def test_a_training_set_too_small_for_the_default_delta_is_refused(tmp_path):
    with pytest.raises(MisconfigurationException, match="only 5 examples"):
        fit(tmp_path, DPCallback(noise_multiplier=1.0), data=TinyData(batch_size=2), max_steps=1)


# ------------------------------------------------------------------------------------------------ reporting
def test_the_final_epsilon_is_printed_and_part_of_the_test_metrics(tmp_path, caplog):
    callback = DPCallback(noise_multiplier=1.0, delta=1e-5)
    with caplog.at_level(logging.INFO):
        trainer = fit(tmp_path, callback, save=True, max_epochs=1)
    final = [r.getMessage() for r in caplog.records if "final epsilon" in r.getMessage()]
    assert final == [
        f"DPCallback: final epsilon={callback.epsilon():.4f}, delta=1e-05, accountant={callback.accountant}, steps=5"
    ]
    (metrics,) = trainer.test(datamodule=digits(batch_size=256), verbose=False)
    assert metrics["privacy/epsilon"] == pytest.approx(callback.epsilon())
    fresh = quiet_trainer(tmp_path, callbacks=[DPCallback(noise_multiplier=1.0, delta=1e-5)])
    (restored,) = fresh.test(dpsgd(), digits(batch_size=256), ckpt_path=tmp_path / CKPT, verbose=False)
    expected = PrivacyLedger([(1.0, callback.loaders.sample_rate, 5)]).epsilon(1e-5)
    assert restored["privacy/epsilon"] == pytest.approx(expected)
