"""Small builders shared by the tests (imported as ``tests.helpers``)."""

from __future__ import annotations

import lightning as L

from lightning_dprobust.data import DigitsDataModule


def quiet_trainer(tmp_path, **kwargs) -> L.Trainer:
    """A CPU trainer with no logger, progress bar or checkpoints unless asked for."""
    defaults = dict(
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
        num_sanity_val_steps=0,
        limit_val_batches=0,
    )
    return L.Trainer(**(defaults | kwargs))


def digits(batch_size: int = 64, **kwargs) -> DigitsDataModule:
    return DigitsDataModule(batch_size=batch_size, **kwargs)
