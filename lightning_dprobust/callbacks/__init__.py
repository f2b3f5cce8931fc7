"""Lightning callbacks: ``DPCallback`` (DP-SGD) and the adversarial augmentation callback."""

from lightning_dprobust.callbacks.attack import AdversarialAugmentation as AdversarialAugmentation
from lightning_dprobust.callbacks.dp import DPCallback, StopReason

__all__ = ["DPCallback", "StopReason"]
