"""torchmetrics metrics: certified accuracy, average certified radius, robust accuracy, calibration error; and the
similarity of synthetic to real EHRs."""

from lightning_dprobust.metrics.calibration import PaperCalibrationError
from lightning_dprobust.metrics.certified import (
    AverageCertifiedRadius,
    CertifiedAccuracy,
    average_certified_radius,
    certified_accuracy,
)
from lightning_dprobust.metrics.robust import RobustAccuracy, robust_accuracy
from lightning_dprobust.metrics.synthetic import ClusterSimilarity, cluster_similarity, similarity_report
from lightning_dprobust.metrics.synthetic_metric import SyntheticSimilarity

__all__ = [
    "AverageCertifiedRadius",
    "CertifiedAccuracy",
    "ClusterSimilarity",
    "PaperCalibrationError",
    "RobustAccuracy",
    "SyntheticSimilarity",
    "average_certified_radius",
    "certified_accuracy",
    "cluster_similarity",
    "robust_accuracy",
    "similarity_report",
]
