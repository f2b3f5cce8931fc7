"""A PNG of AIN's example adversarial images: written to the run folder and logged to W&B when a logger is set."""

from __future__ import annotations

from pathlib import Path

import lightning as L
import torch
from torch import Tensor
from torchvision.utils import save_image


def log_examples(trainer: L.Trainer, clean: Tensor, adversarial: Tensor, epoch: int) -> str | None:
    """Save a grid (row 1: clean, row 2: adversarial, row 3: perturbation rescaled to [0, 1]) as
    ``<run folder>/ain_examples/epoch_<epoch>.png`` and log it to every WandbLogger; call it on every rank (the run
    folder is agreed on by a broadcast), only rank zero writes."""
    folder = Path(trainer.log_dir or trainer.default_root_dir) / "ain_examples"  # log_dir is a collective: all ranks
    if not trainer.is_global_zero or clean.numel() == 0:
        return None
    perturbation = adversarial - clean
    scale = perturbation.abs().amax().clamp_min(1e-12)
    grid = torch.cat([clean, adversarial, 0.5 + 0.5 * perturbation / scale]).float().cpu()
    folder.mkdir(parents=True, exist_ok=True)
    path = str(folder / f"epoch_{epoch:03d}.png")
    save_image(grid, path, nrow=clean.shape[0], padding=1)
    for logger in trainer.loggers:
        if type(logger).__name__ == "WandbLogger":
            logger.log_image(key="ain/examples", images=[path], step=trainer.global_step)
    return path


__all__ = ["log_examples"]
