"""Reproducibility on CPU: a seed fixes a DP-SGD run bit for bit, and every step still draws a fresh Poisson batch."""

from __future__ import annotations

import lightning as L
import torch

from lightning_dprobust.callbacks import DPCallback
from lightning_dprobust.methods import DPSGD
from tests.crash_helpers import batch_fingerprint
from tests.helpers import digits, quiet_trainer

EPOCHS = 3


class BatchLog(L.Callback):
    def __init__(self) -> None:
        self.batches: list[str] = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.batches.append(batch_fingerprint(batch))


def train(tmp_path, seed: int) -> dict:
    """Seeded DP-SGD on digits for EPOCHS epochs; the parameters, epsilon, test accuracy and batches it used."""
    L.seed_everything(seed, verbose=False)
    module = DPSGD(model="cnn_tanh", num_classes=10, input_shape=(1, 8, 8), lr=0.5)
    callback, log = DPCallback(max_grad_norm=1.0, noise_multiplier=1.0, delta=1e-5, seed=seed), BatchLog()
    trainer = quiet_trainer(tmp_path, max_epochs=EPOCHS, callbacks=[callback, log])
    data = digits(batch_size=128, seed=seed)
    trainer.fit(module, data)
    (metrics,) = trainer.test(module, datamodule=data, verbose=False)
    return {
        "parameters": [p.detach().clone() for p in module.parameters()],
        "epsilon": callback.epsilon(),
        "test_acc": metrics["test/acc"],
        "batches": log.batches,
        "steps": trainer.global_step,
    }


def test_the_same_seed_gives_the_same_epsilon_metrics_and_parameters_bit_for_bit(tmp_path):
    first, second = train(tmp_path, seed=3), train(tmp_path, seed=3)
    assert all(torch.equal(a, b) for a, b in zip(first["parameters"], second["parameters"], strict=True))
    assert first["epsilon"] == second["epsilon"] > 0
    assert first["test_acc"] == second["test_acc"] > 0.3  # and the model learned something
    assert first["batches"] == second["batches"]


def test_another_seed_gives_other_batches_and_parameters_but_the_same_epsilon(tmp_path):
    first, other = train(tmp_path, seed=3), train(tmp_path, seed=4)
    assert first["batches"] != other["batches"]
    assert not torch.equal(first["parameters"][0], other["parameters"][0])
    assert first["steps"] == other["steps"]
    assert first["epsilon"] == other["epsilon"]  # epsilon depends on noise, sample rate and steps only


def test_every_step_draws_a_fresh_poisson_batch(tmp_path):
    """The accountant composes independent Poisson samples: no batch may come back in a later epoch."""
    batches = train(tmp_path, seed=3)["batches"]
    assert len(batches) == EPOCHS * round(1293 / 128)
    assert len(set(batches)) == len(batches), "an epoch replayed the Poisson batches of an earlier epoch"
