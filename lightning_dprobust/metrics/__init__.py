"""torchmetrics metrics: certified accuracy, average certified radius, robust accuracy, calibration error."""

from lightning_dprobust.metrics.calibration import PaperCalibrationError
from lightning_dprobust.metrics.certified import (
    AverageCertifiedRadius,
    CertifiedAccuracy,
    average_certified_radius,
    certified_accuracy,
)
from lightning_dprobust.metrics.robust import RobustAccuracy, robust_accuracy

__all__ = [
    "AverageCertifiedRadius",
    "CertifiedAccuracy",
    "PaperCalibrationError",
    "RobustAccuracy",
    "average_certified_radius",
    "certified_accuracy",
    "robust_accuracy",
]
