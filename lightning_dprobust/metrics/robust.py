"""Robust accuracy: accuracy on adversarial (or otherwise perturbed) inputs.

Robust accuracy under an attack is the fraction of examples still classified correctly after the attack perturbed
them within its budget, as reported by Madry et al. (2018), https://arxiv.org/abs/1706.06083. The metric only counts;
producing the adversarial inputs is the attack's job. Fed the predictions of a PixelDP classifier on attacked inputs it
is the "conventional accuracy" of Lecuyer et al. (2019) and Phan et al. (2020).
"""

from __future__ import annotations

import torch
from torch import Tensor
from torchmetrics import Metric

from lightning_dprobust.core.smoothing import ABSTAIN


def robust_accuracy(preds: Tensor, targets: Tensor) -> Tensor:
    """Fraction of correct predictions on perturbed inputs.

    Args:
        preds: class indices ``(N,)`` (``-1`` abstains and is never correct) or scores ``(N, C)`` (logits or
            probabilities; the argmax is the prediction).
        targets: true classes, shape ``(N,)``.

    Returns:
        Scalar float tensor; ``nan`` when ``N == 0``.

    Example:
        >>> import torch
        >>> robust_accuracy(torch.tensor([[2.0, 1.0], [0.0, 3.0], [1.0, 0.0]]), torch.tensor([0, 1, 1]))
        tensor(0.6667)
    """
    correct, total = _robust_accuracy_update(preds, targets)
    return correct.float() / total


class RobustAccuracy(Metric):
    """Accuracy on adversarial inputs (Madry et al. 2018, https://arxiv.org/abs/1706.06083).

    ``update`` takes class indices (``-1`` abstains and is never correct) or ``(N, C)`` scores. States are sums of
    correct and total counts, exact under distributed reduction.

    Example:
        >>> import torch
        >>> metric = RobustAccuracy()
        >>> metric.update(torch.tensor([[2.0, 1.0], [0.0, 3.0]]), torch.tensor([0, 0]))
        >>> metric.update(torch.tensor([1, -1]), torch.tensor([1, 1]))
        >>> metric.compute()
        tensor(0.5000)
    """

    is_differentiable: bool = False
    higher_is_better: bool = True
    full_state_update: bool = False
    plot_lower_bound: float = 0.0
    plot_upper_bound: float = 1.0

    correct: Tensor
    total: Tensor

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.add_state("correct", default=torch.tensor(0, dtype=torch.long), dist_reduce_fx="sum")
        self.add_state("total", default=torch.tensor(0, dtype=torch.long), dist_reduce_fx="sum")

    def update(self, preds: Tensor, targets: Tensor) -> None:
        """Add a batch: predictions ``(N,)`` or scores ``(N, C)``, and targets ``(N,)``."""
        correct, total = _robust_accuracy_update(preds, targets)
        self.correct += correct
        self.total += total

    def compute(self) -> Tensor:
        """Robust accuracy, a scalar."""
        return self.correct.float() / self.total


def _robust_accuracy_update(preds: Tensor, targets: Tensor) -> tuple[Tensor, Tensor]:
    if preds.dim() == 2 and preds.is_floating_point():
        preds = preds.argmax(1)
    if preds.dim() != 1 or preds.shape != targets.shape or preds.is_floating_point():
        raise ValueError(
            "preds must be class indices of shape (N,) or float scores of shape (N, C), with targets of shape (N,); "
            f"got preds {tuple(preds.shape)} ({preds.dtype}) and targets {tuple(targets.shape)}"
        )
    correct = ((preds == targets) & (preds != ABSTAIN)).sum()
    return correct, torch.tensor(targets.numel(), device=targets.device)
