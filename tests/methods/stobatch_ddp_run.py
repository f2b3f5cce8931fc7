"""Trains StoBatch on digits under Lightning DDP (gloo, CPU) and saves each rank's state.

Usage: ``python tests/methods/stobatch_ddp_run.py OUT_DIR DEVICES`` (launched by test_stobatch_ddp.py).
"""

from __future__ import annotations

import sys
from pathlib import Path

import lightning as L
import torch

from lightning_dprobust.data import DigitsDataModule
from lightning_dprobust.methods import StoBatch
from tests.helpers import quiet_trainer


def main(out_dir: Path, devices: int) -> None:
    L.seed_everything(0)
    torch.set_num_threads(1)
    trainer = quiet_trainer(
        out_dir, devices=devices, strategy="ddp" if devices > 1 else "auto", max_epochs=2, use_distributed_sampler=False
    )
    module = StoBatch(batch_size=120, attack_steps=1, num_classes=10, input_shape=(1, 8, 8))
    initial = torch.cat([p.detach().flatten() for p in module.parameters()])
    trainer.fit(module, DigitsDataModule())
    served = [list(batch) for batch in trainer.train_dataloader.batch_sampler]
    state = {
        "initial": initial,
        "params": torch.cat([p.detach().flatten() for p in module.parameters()]),
        "noise": torch.cat([module.input_draws.flatten(), module.net.hidden_noise.flatten()]),
        "batches": module.batches,
        "served": served,
        "steps": trainer.global_step,
        "epsilon": module.ledger.nominal[0].epsilon,
        "world_size": trainer.world_size,
    }
    torch.save(state, out_dir / f"rank{trainer.global_rank}.pt")


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]))
