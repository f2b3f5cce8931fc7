"""Load a trained classifier from a Lightning checkpoint or a zoo entry, for certification, attacks and audits."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from lightning_dprobust.methods.checkpoints import load_checkpoint_module


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
        return load_checkpoint_module(path, map_location).eval()
    from lightning_dprobust import zoo

    return zoo.load(source)


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


def denoiser_provenance(denoiser: str) -> tuple[float | None, str | None]:
    """The smoothing ``sigma`` a denoiser was trained for and the classifier it was trained in front of (a zoo name or
    ``timm/<arch>``), from a TransDenoiser ``.ckpt``'s hyperparameters or a zoo denoiser entry's ``meta``; ``None``
    where the source does not say."""
    path = Path(denoiser)
    if path.suffix == ".ckpt" or path.exists():
        from lightning_dprobust.checkpoint_io import read_checkpoint

        hparams = read_checkpoint(path).get("hyper_parameters") or {}
        classifier = hparams.get("classifier")
        sigma = hparams.get("sigma")
        return (float(sigma) if sigma is not None else None), (classifier if isinstance(classifier, str) else None)
    from lightning_dprobust import zoo

    meta = zoo.info(denoiser).meta
    sigma = (meta.get("smoothing") or {}).get("sigma")
    return (float(sigma) if sigma is not None else None), meta.get("classifier")
