"""Certified accuracy and average certified radius of a smoothed classifier.

Definitions from Cohen, Rosenfeld and Kolter (2019), https://arxiv.org/abs/1902.02918 (certified accuracy at radius
``r``: the fraction of examples whose certified prediction is correct with certified radius at least ``r``), and Zhai
et al. (2020), "MACER", https://arxiv.org/abs/2001.02378 (average certified radius, ACR: the mean over examples of the
certified radius when the prediction is correct and 0 otherwise). Inputs are the outputs of
:meth:`lightning_dprobust.core.smoothing.Smooth.certify`; an abstention (prediction ``-1``) is never correct.

PixelDP certificates (Lecuyer et al. 2019; Phan et al. 2020, Sec. 4) plug in as they are: their radius is an l_inf
radius, there is no abstention, and "correct and radius >= mu_a" is Algorithm 3's certified accuracy at attack size
``mu_a`` (see :func:`lightning_dprobust.robustness.pixeldp.pixeldp_metrics`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor
from torchmetrics import Metric

from lightning_dprobust.core.smoothing import ABSTAIN


def certified_accuracy(
    predictions: Tensor, radius: Tensor, targets: Tensor, radii: Sequence[float] = (0.0, 0.25, 0.5, 0.75)
) -> Tensor:
    """Fraction of examples certified correct at each radius in ``radii``.

    Args:
        predictions: certified classes, shape ``(N,)``; ``-1`` means abstain.
        radius: certified radius of each example, shape ``(N,)``.
        targets: true classes, shape ``(N,)``.
        radii: radii at which to evaluate.

    Returns:
        Float tensor of shape ``(len(radii),)``; ``nan`` when ``N == 0``.

    Example:
        >>> import torch
        >>> certified_accuracy(torch.tensor([0, 1, -1]), torch.tensor([0.3, 0.6, 0.0]), torch.tensor([0, 1, 2]),
        ...                    radii=(0.0, 0.5))
        tensor([0.6667, 0.3333])
    """
    correct, total = _certified_accuracy_update(predictions, radius, targets, _check_radii(radii))
    return _ratio(correct, total)


def average_certified_radius(predictions: Tensor, radius: Tensor, targets: Tensor) -> Tensor:
    """Mean over examples of the certified radius if the certified prediction is correct, else 0 (ACR).

    Args:
        predictions: certified classes, shape ``(N,)``; ``-1`` means abstain.
        radius: certified radius of each example, shape ``(N,)``.
        targets: true classes, shape ``(N,)``.

    Returns:
        Scalar float tensor; ``nan`` when ``N == 0``.

    Example:
        >>> import torch
        >>> average_certified_radius(torch.tensor([0, 1, -1]), torch.tensor([0.3, 0.6, 0.0]), torch.tensor([0, 0, 2]))
        tensor(0.1000)
    """
    radius_sum, total = _average_certified_radius_update(predictions, radius, targets)
    return _ratio(radius_sum, total)


class CertifiedAccuracy(Metric):
    """Certified accuracy at several radii (Cohen et al. 2019, https://arxiv.org/abs/1902.02918).

    An example counts as correct at radius ``r`` when its certified prediction equals its target and its certified
    radius is at least ``r``; abstentions (``-1``) never count. States are sums, so results are exact under
    distributed reduction and do not depend on how examples are split into batches or ranks.

    Args:
        radii: non-negative radii at which to report the certified accuracy.

    Example:
        >>> import torch
        >>> metric = CertifiedAccuracy(radii=(0.0, 0.5))
        >>> metric.update(torch.tensor([0, 1]), torch.tensor([0.3, 0.6]), torch.tensor([0, 1]))
        >>> metric.update(torch.tensor([-1, 2]), torch.tensor([0.0, 0.9]), torch.tensor([2, 0]))
        >>> metric.compute()
        tensor([0.5000, 0.2500])
    """

    is_differentiable: bool = False
    higher_is_better: bool = True
    full_state_update: bool = False
    plot_lower_bound: float = 0.0
    plot_upper_bound: float = 1.0

    correct: Tensor
    total: Tensor

    def __init__(self, radii: Sequence[float] = (0.0, 0.25, 0.5, 0.75), **kwargs) -> None:
        super().__init__(**kwargs)
        self.radii = _check_radii(radii)
        self.add_state("correct", default=torch.zeros(len(self.radii), dtype=torch.long), dist_reduce_fx="sum")
        self.add_state("total", default=torch.tensor(0, dtype=torch.long), dist_reduce_fx="sum")

    def update(self, predictions: Tensor, radius: Tensor, targets: Tensor) -> None:
        """Add a batch of certificates: ``(N,)`` predictions (``-1`` abstains), radii and targets."""
        correct, total = _certified_accuracy_update(predictions, radius, targets, self.radii)
        self.correct += correct
        self.total += total

    def compute(self) -> Tensor:
        """Certified accuracy at each of ``radii``, shape ``(len(radii),)``."""
        return _ratio(self.correct, self.total)


class AverageCertifiedRadius(Metric):
    """Average certified radius, ACR (Zhai et al. 2020, https://arxiv.org/abs/2001.02378).

    The mean over examples of the certified radius when the certified prediction equals the target, and 0 for wrong
    predictions and abstentions (``-1``). States are sums, exact under distributed reduction.

    Example:
        >>> import torch
        >>> metric = AverageCertifiedRadius()
        >>> metric.update(torch.tensor([0, 1]), torch.tensor([0.3, 0.6]), torch.tensor([0, 1]))
        >>> metric.update(torch.tensor([-1, 2]), torch.tensor([0.0, 0.9]), torch.tensor([2, 0]))
        >>> metric.compute()
        tensor(0.2250)
    """

    is_differentiable: bool = False
    higher_is_better: bool = True
    full_state_update: bool = False
    plot_lower_bound: float = 0.0

    radius_sum: Tensor
    total: Tensor

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.add_state("radius_sum", default=torch.tensor(0.0), dist_reduce_fx="sum")
        self.add_state("total", default=torch.tensor(0, dtype=torch.long), dist_reduce_fx="sum")

    def update(self, predictions: Tensor, radius: Tensor, targets: Tensor) -> None:
        """Add a batch of certificates: ``(N,)`` predictions (``-1`` abstains), radii and targets."""
        radius_sum, total = _average_certified_radius_update(predictions, radius, targets)
        self.radius_sum += radius_sum
        self.total += total

    def compute(self) -> Tensor:
        """The average certified radius, a scalar."""
        return _ratio(self.radius_sum, self.total)


def _certified_accuracy_update(
    predictions: Tensor, radius: Tensor, targets: Tensor, radii: tuple[float, ...]
) -> tuple[Tensor, Tensor]:
    hits = _correct(predictions, radius, targets)
    thresholds = torch.tensor(radii, dtype=radius.dtype, device=radius.device)
    certified = hits[:, None] & (radius[:, None] >= thresholds[None, :])
    return certified.sum(0), torch.tensor(targets.numel(), device=targets.device)


def _average_certified_radius_update(predictions: Tensor, radius: Tensor, targets: Tensor) -> tuple[Tensor, Tensor]:
    hits = _correct(predictions, radius, targets)
    return torch.where(hits, radius, 0.0).sum(), torch.tensor(targets.numel(), device=targets.device)


def _correct(predictions: Tensor, radius: Tensor, targets: Tensor) -> Tensor:
    if not predictions.shape == radius.shape == targets.shape or predictions.dim() != 1:
        raise ValueError(
            "predictions, radius and targets must be 1-D tensors of equal length (one certificate per example), got "
            f"shapes {tuple(predictions.shape)}, {tuple(radius.shape)} and {tuple(targets.shape)}"
        )
    if not radius.is_floating_point():
        raise TypeError(f"radius must be a floating-point tensor, got dtype {radius.dtype}")
    return (predictions == targets) & (predictions != ABSTAIN)


def _check_radii(radii: Sequence[float]) -> tuple[float, ...]:
    values = tuple(float(r) for r in radii)
    if not values or not all(math.isfinite(r) and r >= 0 for r in values):
        raise ValueError(f"radii must be a non-empty sequence of finite non-negative numbers, got {radii!r}")
    return values


def _ratio(numerator: Tensor, total: Tensor) -> Tensor:
    return numerator.float() / total
