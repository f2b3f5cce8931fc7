"""Runs TransDenoiser on digits under Lightning DDP (gloo, CPU); saves each rank's denoiser, sigma_bar and ledger.

Usage: ``python tests/methods/transdenoiser_ddp_run.py OUT_DIR DEVICES BATCH_SIZE_PER_DEVICE`` (launched by
test_transdenoiser_ddp.py).
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import lightning as L
import torch

from lightning_dprobust.callbacks import TransDenoiserCallback
from lightning_dprobust.data import DigitsDataModule
from lightning_dprobust.methods import TransDenoiser
from tests.helpers import quiet_trainer


class Recorder(L.Callback):
    def __init__(self, dp: TransDenoiserCallback) -> None:
        self.dp, self.steps = dp, []

    def on_train_batch_end(self, trainer, *args) -> None:
        self.steps.append([self.dp.last_multipliers[key] for key in ("first", "middle", "last")])


def main(out_dir: Path, devices: int, batch_size: int) -> None:
    warnings.filterwarnings("ignore", message="noise seed")
    warnings.filterwarnings("ignore", message=".*reproducibility mode")
    L.seed_everything(0)
    torch.set_num_threads(1)
    dp = TransDenoiserCallback(
        mode="transdenoiser", xi_up=2.0, target_epsilon=1.0, delta=1e-5, seed=7, transform_slices=("last",)
    )

    recorder = Recorder(dp)
    trainer = quiet_trainer(
        out_dir,
        devices=devices,
        strategy="ddp" if devices > 1 else "auto",
        max_steps=3,
        use_distributed_sampler=False,
        callbacks=[dp, recorder],
    )
    classifier = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 10))
    kwargs = {"width": 16, "depth": 3, "groups": 4}
    module = TransDenoiser(classifier=classifier, input_shape=(1, 8, 8), denoiser_kwargs=kwargs, seed=8)
    trainer.fit(module, DigitsDataModule(batch_size=batch_size))
    state = {
        "denoiser": torch.cat([p.detach().flatten() for p in module.denoiser.parameters()]),
        "classifier": torch.cat([p.detach().flatten() for p in module.classifier.parameters()]),
        "multipliers": torch.tensor(recorder.steps, dtype=torch.float64),
        "ledger": dp.ledger.state_dict(),
        "epsilon": dp.epsilon(),
        "world_size": trainer.world_size,
    }
    torch.save(state, out_dir / f"rank{trainer.global_rank}.pt")


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]))
