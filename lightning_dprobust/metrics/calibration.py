"""Calibration error: the standard ECE of Guo et al. 2017 and the DP-Adv paper's own 20-bin variant.

The standard expected calibration error (Guo, Pleiss, Sun, Weinberger 2017, https://arxiv.org/abs/1706.04599) is
``sum_b |B_b| / n * |acc_b - conf_b|`` over equal-width confidence bins, ``conf_b`` the bins' mean confidence; use
``torchmetrics.classification.MulticlassCalibrationError(n_bins=15, norm="l1")``.

Bu et al.'s DP-Adv tables (arXiv 2112.12497, Tables 5-6) use a different quantity, reproduced by
:class:`PaperCalibrationError`: 20 bins of width 0.05 with *strict* bounds ``b/20 < conf < (b+1)/20``, the bin
centre as its confidence, bins whose accuracy is 0 (empty ones included) dropped, and an *unweighted* mean (ECE)
or maximum (MCE) of ``|centre_b - acc_b|`` over the kept bins. Report it only to compare with that paper.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torchmetrics import Metric


class PaperCalibrationError(Metric):
    """DP-Adv's unweighted 20-bin calibration error (``norm="mean"``: ECE, ``norm="max"``: MCE).

    States are per-bin counts and correct counts (summed, exact under distributed reduction).

    Example:
        >>> import torch
        >>> metric = PaperCalibrationError()
        >>> probs = torch.tensor([[0.93, 0.07], [0.93, 0.07], [0.62, 0.38], [0.62, 0.38]])
        >>> metric.update(probs, torch.tensor([0, 1, 0, 0]))
        >>> metric.compute()  # bins 0.925 (acc 0.5) and 0.625 (acc 1.0): mean(0.425, 0.375)
        tensor(0.4000)
    """

    is_differentiable = False
    higher_is_better = False
    full_state_update = False

    counts: Tensor
    correct: Tensor

    def __init__(self, num_bins: int = 20, norm: str = "mean", **kwargs) -> None:
        super().__init__(**kwargs)
        if norm not in ("mean", "max"):
            raise ValueError(f"norm must be 'mean' (ECE) or 'max' (MCE), got {norm!r}")
        self.num_bins, self.norm = num_bins, norm
        self.add_state("counts", torch.zeros(num_bins, dtype=torch.long), dist_reduce_fx="sum")
        self.add_state("correct", torch.zeros(num_bins, dtype=torch.long), dist_reduce_fx="sum")

    def update(self, probs: Tensor, targets: Tensor) -> None:
        """``probs``: ``(N, C)`` class probabilities; ``targets``: ``(N,)`` class indices."""
        confidence, prediction = probs.max(dim=1)
        width = 1.0 / self.num_bins
        index = (confidence / width).floor().long().clamp(max=self.num_bins - 1)
        strictly_inside = (confidence > index * width) & (confidence < (index + 1) * width)
        index, hits = index[strictly_inside], (prediction == targets)[strictly_inside]
        self.counts += torch.bincount(index, minlength=self.num_bins)
        self.correct += torch.bincount(index, weights=hits.float(), minlength=self.num_bins).long()

    def compute(self) -> Tensor:
        accuracy = self.correct.float() / self.counts.clamp(min=1)
        centres = (torch.arange(self.num_bins, device=accuracy.device) + 0.5) / self.num_bins
        gaps = (centres - accuracy).abs()[accuracy != 0]
        if gaps.numel() == 0:
            return torch.tensor(0.0, device=accuracy.device)
        return gaps.mean() if self.norm == "mean" else gaps.max()
