"""Secret randomness of DPCallback: masks and noise are not reproducible from any seed a user sets, never replayed."""

from __future__ import annotations

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from lightning_dprobust.callbacks import DPCallback
from lightning_dprobust.zoo.build import privacy_record, save_weights
from tests.crash_helpers import batch_fingerprint
from tests.helpers import GradientRecorder, ZeroGradient, digits, quiet_trainer

pytestmark = pytest.mark.usefixtures("dp_engine")  # each test on both engines (conftest.py)

STEPS_PER_EPOCH = 5  # batch 256 of the 1,293 training digits


class BatchLog(L.Callback):
    def __init__(self) -> None:
        self.batches: list[str] = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.batches.append(batch_fingerprint(batch))


class ReseedsTheGlobalRng(ZeroGradient):
    """Calls ``torch.manual_seed(0)`` in every training step, as torchattacks' APGD, FAB and Square do."""

    def training_step(self, batch, batch_idx):
        torch.manual_seed(0)
        return super().training_step(batch, batch_idx)


def zero_gradient(module_class=ZeroGradient) -> ZeroGradient:
    return module_class(model="cnn_tanh", num_classes=10, input_shape=(1, 8, 8))


def noise_and_batches(tmp_path, callback, module=None, ckpt_path=None, checkpoint=None, **trainer_kwargs):
    """Fit a zero-gradient model (its gradients are the noise alone); return the noise and batches of each step."""
    recorder, log = GradientRecorder(), BatchLog()
    callbacks = [callback, recorder, log] + ([checkpoint] if checkpoint else [])
    trainer = quiet_trainer(tmp_path, callbacks=callbacks, enable_checkpointing=bool(checkpoint), **trainer_kwargs)
    trainer.fit(module or zero_gradient(), digits(batch_size=256), ckpt_path=ckpt_path)
    return recorder.grads, log.batches


def all_different(first: list[torch.Tensor], second: list[torch.Tensor]) -> bool:
    return not any(torch.equal(a, b) for a in first for b in second)


def test_noise_and_masks_are_not_reproducible_from_the_seeds_a_user_sets(tmp_path):
    runs = []
    for _ in range(2):
        L.seed_everything(0, verbose=False)
        runs.append(noise_and_batches(tmp_path, DPCallback(noise_multiplier=1.0, delta=1e-5), max_steps=3))
    (noise_a, batches_a), (noise_b, batches_b) = runs
    assert all_different(noise_a, noise_b)
    assert not set(batches_a) & set(batches_b)


def test_reseeding_the_global_rng_in_a_training_step_changes_no_noise(tmp_path):
    noise, _ = noise_and_batches(
        tmp_path, DPCallback(noise_multiplier=1.0), zero_gradient(ReseedsTheGlobalRng), max_steps=3
    )
    assert all_different(noise[:1], noise[1:]), "the noise of consecutive steps was regenerated from seed 0"
    # in reproducibility mode the noise is a function of the callback's seed alone, whatever the step does
    with pytest.warns(UserWarning, match="reproducibility mode"):
        plain, reseeding = DPCallback(noise_multiplier=1.0, seed=5), DPCallback(noise_multiplier=1.0, seed=5)
    expected, _ = noise_and_batches(tmp_path, plain, max_steps=3)
    observed, _ = noise_and_batches(tmp_path, reseeding, zero_gradient(ReseedsTheGlobalRng), max_steps=3)
    assert all(torch.equal(a, b) for a, b in zip(expected, observed, strict=True))


@pytest.mark.parametrize("seed", [None, 7])
def test_a_second_fit_with_the_same_callback_draws_fresh_masks_and_noise(tmp_path, seed):
    callback, module = DPCallback(noise_multiplier=1.0, seed=seed), zero_gradient()  # one model, trained on
    noise_a, batches_a = noise_and_batches(tmp_path, callback, module, max_steps=4)
    noise_b, batches_b = noise_and_batches(tmp_path, callback, module, max_steps=4)
    assert not set(batches_a) & set(batches_b), "the second fit replayed Poisson masks of the first"
    assert all_different(noise_a, noise_b)
    assert callback.ledger.steps == 8


@pytest.mark.parametrize("seed", [None, 7])
def test_a_resume_never_replays_noise_or_masks(tmp_path, seed):
    checkpoint = ModelCheckpoint(dirpath=tmp_path / "ckpt", save_last=True)
    L.seed_everything(0, verbose=False)
    first_noise, first_batches = noise_and_batches(
        tmp_path, DPCallback(noise_multiplier=1.0, seed=seed), checkpoint=checkpoint, max_epochs=1
    )
    L.seed_everything(0, verbose=False)  # the user's script starts the same way again
    resumed_noise, resumed_batches = noise_and_batches(
        tmp_path, DPCallback(noise_multiplier=1.0, seed=seed), ckpt_path=tmp_path / "ckpt" / "last.ckpt", max_epochs=2
    )
    assert len(resumed_noise) == STEPS_PER_EPOCH
    assert all_different(first_noise, resumed_noise), "a resumed step reused the noise of an earlier step"
    assert not set(first_batches) & set(resumed_batches)
    if seed is not None:  # reproducibility mode: an interrupted run is the uninterrupted one, bit for bit
        L.seed_everything(0, verbose=False)
        unbroken_noise, unbroken_batches = noise_and_batches(
            tmp_path, DPCallback(noise_multiplier=1.0, seed=seed), max_epochs=2
        )
        assert unbroken_batches == first_batches + resumed_batches
        assert all(torch.equal(a, b) for a, b in zip(unbroken_noise, first_noise + resumed_noise, strict=True))


def test_checkpoints_hold_randomness_only_in_reproducibility_mode(tmp_path):
    states = {}
    for seed in (None, 7):
        directory = tmp_path / str(seed)
        checkpoint = ModelCheckpoint(dirpath=directory, save_last=True)
        noise_and_batches(tmp_path, DPCallback(noise_multiplier=1.0, seed=seed), checkpoint=checkpoint, max_steps=2)
        states[seed] = torch.load(directory / "last.ckpt", weights_only=True)["callbacks"]["DPCallback"]
    assert states[None]["randomness"] == {}
    assert states[7]["randomness"] == {"fit_index": 1}
    assert not any("seed" in key or "generator" in key for key in states[None])


def test_released_weights_and_privacy_records_hold_no_randomness(tmp_path):
    module, callback = zero_gradient(), DPCallback(noise_multiplier=1.0, seed=3)
    quiet_trainer(tmp_path, callbacks=[callback], max_steps=2).fit(module, digits(batch_size=256))
    file, _ = save_weights(module.model, tmp_path / "weights", "entry")
    released = torch.load(tmp_path / "weights" / file, weights_only=True)
    assert set(released) == set(module.model.state_dict())
    assert all(isinstance(value, torch.Tensor) for value in released.values())
    record = privacy_record(callback)
    assert not {"seed", "randomness", "generator"} & set(record)
    assert all(isinstance(value, (int, float, str)) for value in record.values())
