"""Rebuild a lightning-dprobust module from a Lightning ``.ckpt`` without executing anything stored in it."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from lightning_dprobust.checkpoint_io import check_state_dict_fits, read_checkpoint
from lightning_dprobust.methods.base import CLASS_KEY
from lightning_dprobust.methods.registry import method_class


def load_checkpoint_module(path: str | Path, map_location: str | torch.device = "cpu") -> nn.Module:
    """The module a ``.ckpt`` written by ``dprobust fit`` (or ``Trainer.save_checkpoint``) holds, weights loaded.

    The file is read with ``weights_only=True``; the class it names is looked up in
    :mod:`lightning_dprobust.methods.registry` (reading a checkpoint never imports a module) and rebuilt from the
    stored hyperparameters.

    Raises:
        FileNotFoundError: ``path`` is not a file.
        ValueError: the checkpoint was not written by a lightning-dprobust module, or names an unregistered class.
        CheckpointError: (a ``ValueError``) the file is truncated, holds pickled code, or does not fit its model.
    """
    path = Path(path)
    checkpoint = read_checkpoint(path, map_location)
    qualified = checkpoint.get(CLASS_KEY)
    if qualified is None:
        raise ValueError(
            f"{path} has no '{CLASS_KEY}' entry: it was not written by a lightning-dprobust method "
            "(train with `dprobust fit`, or load the model yourself)"
        )
    cls = method_class(qualified, source=str(path))
    for key in ("hyper_parameters", "state_dict"):
        if not isinstance(checkpoint.get(key), dict):
            raise ValueError(
                f"{path} has no '{key}': it was not saved by a Trainer from a lightning-dprobust module "
                "(the module's arguments and weights are both needed to rebuild it)"
            )
    hyper_parameters = {key: value for key, value in checkpoint["hyper_parameters"].items() if not key.startswith("_")}
    module = cls(**hyper_parameters)  # LightningCLI adds "_class_path" and "_instantiator" to the hyper-parameters
    check_state_dict_fits(module, checkpoint["state_dict"], str(path))
    module.on_load_checkpoint(checkpoint)  # as LightningModule.load_from_checkpoint: restores e.g. privacy ledgers
    module.load_state_dict(checkpoint["state_dict"])
    return module


__all__ = ["load_checkpoint_module"]
