"""ROC analysis of membership-inference scores: AUC, best balanced accuracy, TPR at a fixed low FPR, and a plot.

Scores follow one convention everywhere: a higher score means "more likely a member". Low-FPR operating points
follow Carlini et al. 2022, "Membership Inference Attacks From First Principles" (https://arxiv.org/abs/2112.03570),
who argue that an attack must be judged by its TPR at FPR 0.1% or 1%, not by its AUC alone.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from sklearn.metrics import roc_auc_score
from sklearn.metrics import roc_curve as sklearn_roc_curve

LOW_FPRS = (0.001, 0.01)
"""The false-positive rates at which :func:`roc_metrics` reports the TPR."""


@dataclass(frozen=True)
class RocMetrics:
    """Summary of one attack's ROC curve.

    Attributes:
        auc: area under the ROC curve (0.5: chance; ties count one half).
        balanced_accuracy: ``max_t (TPR(t) + 1 - FPR(t)) / 2`` over all thresholds ``t`` (the best threshold).
        tpr_at_low_fpr: TPR at each FPR of :data:`LOW_FPRS`, linearly interpolated along the ROC curve.
        num_members: positives scored.
        num_nonmembers: negatives scored; FPR 0.1% allows ``0.001 * num_nonmembers`` false positives, so with fewer
            than 1,000 negatives that point is interpolated between zero and one false positive.
        fpr: the ROC curve's false-positive rates, non-decreasing, from 0 to 1.
        tpr: the matching true-positive rates.
    """

    auc: float
    balanced_accuracy: float
    tpr_at_low_fpr: dict[float, float]
    num_members: int
    num_nonmembers: int
    fpr: np.ndarray
    tpr: np.ndarray

    def summary(self) -> dict[str, float]:
        """Flat ``{name: value}`` view: ``auc``, ``balanced_accuracy``, ``tpr@0.1%fpr``, ``tpr@1%fpr``."""
        values = {"auc": self.auc, "balanced_accuracy": self.balanced_accuracy}
        values.update({f"tpr@{100 * fpr:g}%fpr": tpr for fpr, tpr in self.tpr_at_low_fpr.items()})
        return values


def _check(scores: np.ndarray, is_member: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    scores, is_member = np.asarray(scores, dtype=np.float64), np.asarray(is_member)
    if scores.ndim != 1 or scores.shape != is_member.shape:
        raise ValueError(f"scores {scores.shape} and is_member {is_member.shape} must be 1-d arrays of one length")
    if not np.isin(is_member, (0, 1)).all():
        raise ValueError("is_member must hold only 0/1 or False/True")
    is_member = is_member.astype(bool)
    if is_member.all() or not is_member.any():
        raise ValueError("an ROC curve needs at least one member and one non-member")
    if np.isnan(scores).any():
        raise ValueError("scores contain NaN: check the attack's inputs (e.g. a model producing NaN logits)")
    return scores, is_member


def roc_curve(scores: np.ndarray, is_member: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The empirical ROC curve (scikit-learn's ``roc_curve`` with every threshold kept): one point per distinct
    score, thresholds taken from the highest score down.

    Guarantees: both arrays start at 0 and end at 1 and are non-decreasing; the point after threshold ``t`` is
    ``(#non-members with score >= t / #non-members, #members with score >= t / #members)``, so tied scores form one
    (possibly diagonal) segment.
    """
    scores, is_member = _check(scores, is_member)
    fpr, tpr, _ = sklearn_roc_curve(is_member, scores, drop_intermediate=False)
    return fpr, tpr


def roc_auc(scores: np.ndarray, is_member: np.ndarray) -> float:
    """AUC (scikit-learn's ``roc_auc_score``): ``P(score_member > score_nonmember) + P(tie) / 2``."""
    scores, is_member = _check(scores, is_member)
    return float(roc_auc_score(is_member, scores))


def tpr_at_fpr(fpr: np.ndarray, tpr: np.ndarray, target: float) -> float:
    """TPR of the ROC curve at FPR ``target``, linearly interpolated between its points.

    Where the curve is vertical at ``target`` the highest TPR is taken; between two points the interpolation is the
    TPR that a randomized threshold between them achieves.
    """
    if not 0.0 <= target <= 1.0:
        raise ValueError(f"target FPR must lie in [0, 1], got {target}")
    last = int(np.searchsorted(fpr, target, side="right")) - 1
    if fpr[last] == target or last == len(fpr) - 1:
        return float(tpr[last])
    weight = (target - fpr[last]) / (fpr[last + 1] - fpr[last])
    return float(tpr[last] + weight * (tpr[last + 1] - tpr[last]))


def roc_metrics(scores: np.ndarray, is_member: np.ndarray) -> RocMetrics:
    """All of :class:`RocMetrics` for ``scores`` (higher: more likely a member) and the true membership."""
    fpr, tpr = roc_curve(scores, is_member)
    members = int(np.asarray(is_member).astype(bool).sum())
    return RocMetrics(
        auc=roc_auc(scores, is_member),
        balanced_accuracy=float(((tpr + 1.0 - fpr) / 2.0).max()),
        tpr_at_low_fpr={target: tpr_at_fpr(fpr, tpr, target) for target in LOW_FPRS},
        num_members=members,
        num_nonmembers=len(is_member) - members,
        fpr=fpr,
        tpr=tpr,
    )


def low_fpr_note(num_nonmembers: int, target: float = LOW_FPRS[0]) -> str:
    """One sentence saying how many non-members determine the TPR at FPR ``target``."""
    allowed = target * num_nonmembers
    if allowed >= 1:
        return f"FPR {100 * target:g}% allows {allowed:.1f} of {num_nonmembers} non-members above the threshold"
    return (
        f"FPR {100 * target:g}% allows {allowed:.2f} of {num_nonmembers} non-members above the threshold: the TPR "
        "there is interpolated between zero and one false positive, i.e. set by the highest-scoring non-member"
    )


def plot_roc(curves: Mapping[str, RocMetrics], path: str | os.PathLike, title: str = "") -> Path:
    """Write a log-log ROC plot (one curve per attack, chance diagonal dashed) to ``path`` as PNG (Agg canvas, no
    pyplot state, so the caller's backend, e.g. a notebook's inline one, is left alone)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    floor = 0.5 / max(metrics.num_nonmembers for metrics in curves.values())
    figure = Figure(figsize=(4.5, 4.5))
    FigureCanvasAgg(figure)
    axes = figure.subplots()
    for name, metrics in curves.items():
        label = f"{name} (AUC {metrics.auc:.3f})"
        axes.plot(np.maximum(metrics.fpr, floor), np.maximum(metrics.tpr, floor), label=label)
    axes.plot([floor, 1], [floor, 1], "k--", linewidth=0.8, label="chance")
    axes.set(xscale="log", yscale="log", xlim=(floor, 1), ylim=(floor, 1), xlabel="FPR", ylabel="TPR", title=title)
    axes.legend(loc="lower right", fontsize="small")
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    return path
