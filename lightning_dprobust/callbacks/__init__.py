"""Lightning callbacks: ``DPCallback`` (DP-SGD), ``TransDenoiserCallback`` and ``AdversarialAugmentation``."""

from lightning_dprobust.callbacks.attack import AdversarialAugmentation
from lightning_dprobust.callbacks.dp import DPCallback, StopReason
from lightning_dprobust.callbacks.transdenoiser import TransDenoiserCallback

__all__ = ["AdversarialAugmentation", "DPCallback", "StopReason", "TransDenoiserCallback"]
