"""Runs DP-SGD on digits under Lightning DDP (gloo, CPU) and saves each rank's parameters and accounting.

Usage: ``python tests/callbacks/ddp_run.py OUT_DIR DEVICES BATCH_SIZE_PER_DEVICE ENGINE [zero]`` (launched by
test_ddp.py; ENGINE is DPCallback's ``engine``). With ``zero`` every example's loss is constant, so the averaged
gradient is pure noise and its scale shows how many times noise was added.
"""

from __future__ import annotations

import sys
from pathlib import Path

import lightning as L
import torch

from lightning_dprobust.callbacks import DPCallback
from lightning_dprobust.data import DigitsDataModule
from lightning_dprobust.methods import DPSGD
from tests.helpers import GradientRecorder, ZeroGradient, quiet_trainer


def main(out_dir: Path, devices: int, batch_size: int, engine: str, zero_gradient: bool) -> None:
    L.seed_everything(0)
    torch.set_num_threads(1)
    callback = DPCallback(max_grad_norm=1.0, noise_multiplier=1.2, delta=1e-5, engine=engine)
    recorder = GradientRecorder()
    trainer = quiet_trainer(
        out_dir,
        devices=devices,
        strategy="ddp" if devices > 1 else "auto",
        max_epochs=2,
        use_distributed_sampler=False,
        callbacks=[callback, recorder],
        max_steps=3 if zero_gradient else -1,
    )
    module = (ZeroGradient if zero_gradient else DPSGD)(model="cnn_tanh", num_classes=10, input_shape=(1, 8, 8), lr=0.5)
    initial = torch.cat([p.detach().flatten() for p in module.parameters()])
    trainer.fit(module, DigitsDataModule(batch_size=batch_size))
    sampler = callback.loaders._built.batch_sampler
    sampler.set_epoch(0)  # this rank's shards of the first epoch's masks, drawn again from the same secret
    state = {
        "initial": initial,
        "grads": torch.stack(recorder.grads),
        "params": torch.cat([p.detach().flatten() for p in module.parameters()]),
        "epsilon": callback.epsilon(),
        "ledger": callback.ledger.state_dict(),
        "sample_rate": callback.loaders.sample_rate,
        "steps": trainer.global_step,
        "world_size": trainer.world_size,
        "clipper": type(callback._clipper).__name__,
        "first_epoch_batches": list(sampler),
    }
    torch.save(state, out_dir / f"rank{trainer.global_rank}.pt")


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5:] == ["zero"])
