"""Trains ResidualPerturbation on digits under Lightning DDP (gloo, CPU) and saves each rank's state.

Usage: ``python tests/methods/residual_ddp_run.py OUT_DIR DEVICES BATCH_SIZE_PER_DEVICE`` (launched by
test_residual.py).
"""

from __future__ import annotations

import sys
from pathlib import Path

import lightning as L
import torch

from lightning_dprobust.data import DigitsDataModule
from lightning_dprobust.methods import ResidualPerturbation
from tests.helpers import quiet_trainer


def main(out_dir: Path, devices: int, batch_size: int) -> None:
    L.seed_everything(0)
    torch.set_num_threads(1)
    trainer = quiet_trainer(
        out_dir, devices=devices, strategy="ddp" if devices > 1 else "auto", max_epochs=1, limit_train_batches=4
    )
    module = ResidualPerturbation(gamma=0.5, num_classes=10, input_shape=(1, 8, 8))
    initial = torch.cat([p.detach().flatten() for p in module.parameters()])
    trainer.fit(module, DigitsDataModule(batch_size=batch_size))
    module.eval()
    with torch.no_grad():
        probe = module(torch.full((1, 1, 8, 8), 0.5))
    state = {
        "initial": initial,
        "params": torch.cat([p.detach().flatten() for p in module.parameters()]),
        "nominal": module.ledger.state_dict()["nominal"],
        "examples_seen": module.examples_seen,
        "probe": probe,
        "world_size": trainer.world_size,
    }
    torch.save(state, out_dir / f"rank{trainer.global_rank}.pt")


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]))
