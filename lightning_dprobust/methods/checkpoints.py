"""Rebuild a lightning-dprobust module from a Lightning ``.ckpt`` without executing anything stored in it."""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from pathlib import Path
from typing import Any

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
        ValueError: the checkpoint was not written by a lightning-dprobust module, names an unregistered class, or
            holds hyperparameters that class does not take.
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
    check_hyperparameters_taken(cls, hyper_parameters, str(path))
    module = cls(**hyper_parameters)  # LightningCLI adds "_class_path" and "_instantiator" to the hyper-parameters
    check_state_dict_fits(module, checkpoint["state_dict"], str(path))
    module.on_load_checkpoint(checkpoint)  # as LightningModule.load_from_checkpoint: restores e.g. privacy ledgers
    module.load_state_dict(checkpoint["state_dict"])
    return module


def accepted_arguments(cls: type) -> set[str]:
    """The keyword arguments ``cls`` takes: its ``__init__``'s, and its bases' while ``**kwargs`` passes them on."""
    accepted: set[str] = set()
    for klass in cls.__mro__:
        if "__init__" not in vars(klass):
            continue
        parameters = inspect.signature(vars(klass)["__init__"]).parameters.values()
        accepted |= {p.name for p in parameters if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}
        if not any(p.kind is p.VAR_KEYWORD for p in parameters):
            break
    return accepted - {"self"}


def check_hyperparameters_taken(cls: type, hyper_parameters: Mapping[str, Any], source: str) -> None:
    """Raise one ``ValueError`` naming the checkpoint's hyperparameters that ``cls`` does not take (instead of the
    ``TypeError`` of calling ``cls(**hyper_parameters)``)."""
    foreign = sorted(set(hyper_parameters) - accepted_arguments(cls))
    if foreign:
        raise ValueError(
            f"checkpoint {source} holds hyperparameters that {cls.__name__} does not take: {foreign}; it was written "
            "by another version of the method or edited: pass a checkpoint of this one"
        )


__all__ = ["accepted_arguments", "check_hyperparameters_taken", "load_checkpoint_module"]
