"""Lightning callbacks: ``DPCallback`` (DP-SGD) and ``AdversarialAugmentation`` (adversarial training)."""

from lightning_dprobust.callbacks.attack import AdversarialAugmentation
from lightning_dprobust.callbacks.dp import DPCallback, StopReason

__all__ = ["AdversarialAugmentation", "DPCallback", "StopReason"]
