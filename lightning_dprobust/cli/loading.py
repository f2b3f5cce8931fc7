"""Load a trained classifier from a Lightning checkpoint or a zoo entry, for certification, attacks and audits."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from lightning_dprobust.checkpoint_io import check_state_dict_fits, read_checkpoint
from lightning_dprobust.methods.base import CLASS_KEY
from lightning_dprobust.methods.registry import method_class


def load_classifier(source: str, map_location: str | torch.device = "cpu") -> nn.Module:
    """Return the model in eval mode from ``source``: a ``.ckpt`` path written by ``dprobust fit``, or a zoo name.

    Checkpoints are read with ``weights_only=True``: a file that would need to execute pickled code is refused. The
    class a checkpoint names is looked up in :mod:`lightning_dprobust.methods.registry`; reading a checkpoint never
    imports a module.

    Raises:
        FileNotFoundError: ``source`` is neither an existing file nor a zoo entry.
        ValueError: the checkpoint was not written by a lightning-dprobust module, or names an unregistered class.
        CheckpointError: (a ``ValueError``) the file is truncated, holds pickled code, or does not fit its model.
    """
    path = Path(source)
    if path.suffix == ".ckpt" or path.exists():
        if not path.is_file():
            raise FileNotFoundError(f"checkpoint {source} does not exist: pass the path of a .ckpt file or a zoo name")
        return _from_checkpoint(path, map_location).eval()
    from lightning_dprobust import zoo

    return zoo.load(source)


def _from_checkpoint(path: Path, map_location) -> nn.Module:
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


def load_denoised_classifier(classifier: str, denoiser: str, map_location: str | torch.device = "cpu") -> nn.Module:
    """``h(g(x))`` in eval mode: the classifier ``h`` from ``classifier`` behind the denoiser ``g`` from ``denoiser``.

    ``denoiser`` is a ``.ckpt`` written by fitting :class:`~lightning_dprobust.methods.TransDenoiser` or a zoo entry of
    kind ``denoiser``; only its denoiser is used, in front of ``classifier`` (a ``.ckpt`` or a zoo name).

    Raises:
        ValueError: ``denoiser`` holds no denoiser.
    """
    from lightning_dprobust.models import DenoisedClassifier

    source = load_classifier(denoiser, map_location)
    g = getattr(source, "denoiser", None)
    if not isinstance(g, nn.Module):
        raise ValueError(
            f"--denoiser {denoiser!r} holds no denoiser: pass a TransDenoiser .ckpt or a zoo entry of kind denoiser"
        )
    return DenoisedClassifier(load_classifier(classifier, map_location), g).eval()
