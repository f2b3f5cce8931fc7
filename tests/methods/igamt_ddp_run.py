"""Trains a small IGAMT under Lightning DDP (gloo, CPU) and saves each rank's parameters and ledger.

Usage: ``python tests/methods/igamt_ddp_run.py OUT_DIR DEVICES`` (launched by test_igamt_ddp.py).
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import lightning as L
import torch

from tests.helpers import quiet_trainer
from tests.methods.igamt_helpers import EHRData, small


def main(out_dir: Path, devices: int) -> None:
    warnings.filterwarnings("ignore", message=".*reproducibility mode")
    L.seed_everything(0)
    torch.set_num_threads(1)
    module = small(noise_multiplier=1.0, seed=7, critic_freq_base=1)
    trainer = quiet_trainer(
        out_dir, devices=devices, strategy="ddp" if devices > 1 else "auto", max_epochs=1, use_distributed_sampler=False
    )
    trainer.fit(module, EHRData(n=32, batch_size=4))
    state = {
        "params": torch.cat([p.detach().flatten() for p in module.parameters()]),
        "ledger": module.ledger.state_dict(),
        "iterations": module.iteration,
        "world_size": trainer.world_size,
    }
    torch.save(state, out_dir / f"rank{trainer.global_rank}.pt")


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]))
