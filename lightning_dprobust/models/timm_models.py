"""timm architectures behind the ``timm/<arch>`` prefix, made DP-compatible.

timm (Wightman 2019, https://github.com/huggingface/pytorch-image-models) supplies the standard vision backbones.
They are built through ``timm.create_model`` and passed through :func:`make_dp_compatible`, so BatchNorm becomes
GroupNorm and activations stop working in place; per-example gradients are then well defined.
"""

from __future__ import annotations

import logging
from typing import Any

import timm
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from lightning_dprobust.models.dp_compat import make_dp_compatible

log = logging.getLogger(__name__)

TIMM_PREFIX = "timm/"


def list_timm_models() -> list[str]:
    """Return every timm architecture name, prefixed with ``timm/``."""
    return [TIMM_PREFIX + name for name in timm.list_models()]


def is_timm_model(arch: str) -> bool:
    """Return whether timm knows ``arch`` (a name such as ``resnet18`` or ``resnet18.a1_in1k``)."""
    return bool(arch) and timm.is_model(arch)


class PretrainedWeightsError(FileNotFoundError):
    """Pretrained weights were requested but could not be fetched or read (no network, missing file)."""


def create_timm_model(
    arch: str, *, num_classes: int, in_chans: int, pretrained: bool = False, **kwargs: Any
) -> nn.Module:
    """Build timm's ``arch`` with a ``num_classes`` head and ``in_chans`` input channels, then make it DP-compatible.

    Pretrained weights cannot be downloaded where there is no network. Give timm a local file instead:
    ``pretrained=True, pretrained_cfg_overlay=dict(file="/path/to/weights.safetensors")``. timm drops the
    classifier weights when ``num_classes`` differs from the file's and adapts the first convolution when
    ``in_chans != 3``. BatchNorm weights in the file are loaded and then replaced by fresh GroupNorm layers; the swap
    is logged once per model created (a warning of the ``lightning_dprobust.models.timm_models`` logger).

    Args:
        arch: a timm model name, with an optional weight tag (``resnet18.a1_in1k``).
        num_classes: size of the classification head.
        in_chans: number of input image channels.
        pretrained: load pretrained weights.
        **kwargs: forwarded to ``timm.create_model`` (``drop_rate``, ``pretrained_cfg_overlay``, ...).

    Returns:
        The model, with no BatchNorm and no in-place module left.

    Raises:
        PretrainedWeightsError: if ``pretrained=True`` and the weights could not be fetched or read; the message
            says how to supply them, and the cause from timm is chained.
    """
    try:
        model = timm.create_model(arch, pretrained=pretrained, num_classes=num_classes, in_chans=in_chans, **kwargs)
    except OSError as err:
        if not pretrained:
            raise
        raise PretrainedWeightsError(
            f"pretrained weights for timm model '{arch}' could not be fetched or read ({type(err).__name__}: "
            f"{err}). Without network access, download the weights file elsewhere and pass it with "
            "pretrained_cfg_overlay=dict(file='/path/to/model.safetensors'), e.g. create_model("
            f"'timm/{arch}', ..., pretrained=True, pretrained_cfg_overlay=dict(file=...)); set HF_HUB_OFFLINE=1 "
            "to fail fast instead of retrying the Hugging Face Hub"
        ) from err
    swapped = sum(isinstance(module, _BatchNorm) for module in model.modules())
    model = make_dp_compatible(model)
    if swapped:  # one line per model created: a user should know the architecture is not timm's own
        log.warning(
            "timm %s: %d BatchNorm layer(s) replaced by GroupNorm (a BatchNorm mixes the examples of a batch, so "
            "per-example gradients and DP would not hold); running statistics%s are dropped. See docs/sharp_edges.md",
            arch,
            swapped,
            " and the pretrained BatchNorm weights" if pretrained else "",
        )
    return model
