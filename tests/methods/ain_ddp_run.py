"""Trains AIN on digits under Lightning DDP (gloo, CPU) for two epochs; saves each rank's generator, bound,
controller state and validation success rates.

Usage: ``python tests/methods/ain_ddp_run.py OUT_DIR DEVICES`` (launched by test_ain_ddp.py).
"""

from __future__ import annotations

import sys
from pathlib import Path

import lightning as L
import torch

from lightning_dprobust.data import DigitsDataModule
from lightning_dprobust.methods import AIN
from tests.helpers import quiet_trainer


class Recorder(L.Callback):
    def __init__(self) -> None:
        self.success: list[float] = []

    def on_validation_epoch_end(self, trainer, pl_module) -> None:
        self.success.append(pl_module.validation_success())


def main(out_dir: Path, devices: int) -> None:
    L.seed_everything(0)
    torch.set_num_threads(1)
    recorder = Recorder()
    trainer = quiet_trainer(
        out_dir,
        devices=devices,
        strategy="ddp" if devices > 1 else "auto",
        max_epochs=2,
        limit_train_batches=3,
        limit_val_batches=2,
        callbacks=[recorder],
    )
    module = AIN(
        target="mlp_tanh.erm_digits",
        input_shape=(1, 8, 8),
        generator_kwargs={"channels": [4, 4, 4, 4], "attention_channels": 4},
        ifgsm_steps=5,
        ifgsm_alpha=0.04,
        decay_rate=-0.3,
    )
    trainer.fit(module, DigitsDataModule(batch_size=16))
    state = {
        "generator": torch.cat([p.detach().flatten() for p in module.generator.parameters()]),
        "target": torch.cat([p.detach().flatten() for p in module.target.parameters()]),
        "bound": module.bound,
        "controller": module.controller.state_dict(),
        "success": recorder.success,
        "imitated": module.imitation.computed,
        "world_size": trainer.world_size,
    }
    torch.save(state, out_dir / f"rank{trainer.global_rank}.pt")


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]))
