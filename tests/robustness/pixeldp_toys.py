"""Toy PixelDP mechanisms whose expected scores are known in closed form, and a registered toy LightningModule."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from lightning_dprobust.methods import ClassifierModule, register_method


def laplace(shape: tuple[int, ...], scale: float, generator: torch.Generator, device: torch.device) -> Tensor:
    """Laplace(0, scale) draws by inverting the CDF of uniforms taken from ``generator`` only."""
    u = torch.rand(shape, generator=generator, device=device, dtype=torch.float64) - 0.5
    return -scale * torch.sign(u) * torch.log1p(-2 * u.abs())


class ThresholdMechanism(nn.Module):
    """One pixel ``x`` and one Laplace mechanism per scale in ``scales``, composed as in Eq. 11: the score of class 1
    is the product over mechanisms ``s`` of ``1[x + L_s >= t]``, that of class 0 the product of ``1[x + L_s < t]``.

    Laplace noise of scale ``b`` is ``(|alpha| / b)``-DP for a shift ``alpha`` of ``x``, and the mechanisms compose
    (Lemma 5), so one unit of ``epsilon_r`` buys a radius ``1 / sum_s (1 / b_s)`` (``pixeldp_radius_scale``). The
    expected scores are products of Laplace tail probabilities, known exactly (:meth:`expected`).
    """

    pixeldp_attack_norm = "linf"

    def __init__(self, scales: tuple[float, ...] = (0.1,), t: float = 0.5) -> None:
        super().__init__()
        self.scales, self.t, self.modes_seen = scales, t, []

    def pixeldp_scores(self, x: Tensor, n: int, generator: torch.Generator) -> Tensor:
        self.modes_seen.append(self.training)
        pixel = x.reshape(1, -1).double()
        above = [(pixel + laplace((n, len(x)), b, generator, x.device) >= self.t).double() for b in self.scales]
        return torch.stack([math.prod(1 - a for a in above), math.prod(above)], dim=-1)

    def pixeldp_radius_scale(self) -> float:
        return 1.0 / sum(1.0 / b for b in self.scales)

    def expected(self, x: Tensor) -> Tensor:
        """``[B, 2]`` exact ``E f(x)``: products of ``P(L_s >= t - x)`` and of their complements."""
        gap = self.t - x.reshape(-1).double()
        above = [torch.where(gap >= 0, 0.5 * torch.exp(-gap / b), 1 - 0.5 * torch.exp(gap / b)) for b in self.scales]
        return torch.stack([math.prod(1 - a for a in above), math.prod(above)], dim=-1)

    def expected_votes(self, x: Tensor) -> Tensor:
        """``[B, 2]`` exact ``P(argmax f = k)``: class 1 needs every mechanism above ``t``; a tie (``[0, 0]``, the
        mechanisms disagree) is a vote for class 0, the lowest index, as ``argmax`` breaks ties."""
        both = self.expected(x)[:, 1]
        return torch.stack([1 - both, both], dim=-1)


class CategoricalMechanism:
    """Ignores ``x``; each draw is the one-hot of a class drawn from ``probabilities``, so ``E f = probabilities``."""

    pixeldp_attack_norm = "linf"

    def __init__(self, probabilities: list[float], scale: float = 0.5) -> None:
        self.cdf = torch.tensor(probabilities, dtype=torch.float64).cumsum(0)
        self.scale, self.calls = scale, []

    def pixeldp_scores(self, x: Tensor, n: int, generator: torch.Generator) -> Tensor:
        self.calls.append((n, len(x)))
        u = torch.rand((n, len(x)), generator=generator, dtype=torch.float64)
        labels = torch.searchsorted(self.cdf, u, right=True).clamp_max(len(self.cdf) - 1)
        return nn.functional.one_hot(labels, len(self.cdf)).double()

    def pixeldp_radius_scale(self) -> float:
        return self.scale


class ConstantMechanism(CategoricalMechanism):
    """Every draw returns the same scores, so the mean over any ``n`` draws is exactly ``scores``."""

    def __init__(self, scores: list[float], scale: float = 0.5) -> None:
        super().__init__([1.0], scale)
        self.scores = torch.tensor(scores, dtype=torch.float64)

    def pixeldp_scores(self, x: Tensor, n: int, generator: torch.Generator) -> Tensor:
        return self.scores.expand(n, len(x), -1).clone()


@register_method
class ToyPixelDPClassifier(ClassifierModule):
    """A classifier with Laplace noise of scale ``noise_scale`` on its input; scores are the product of two softmaxes
    under independent draws, as StoBatch composes ``p_x * p_h``. The input ball ``l_inf(1)`` of ``d`` pixels has l1
    sensitivity ``d``, and two draws compose, so the radius per unit ``epsilon_r`` is ``noise_scale / (2 d)``."""

    pixeldp_attack_norm = "linf"

    def __init__(self, noise_scale: float = 0.05, psi: float = 1.0, **kwargs) -> None:
        super().__init__(**kwargs)
        self.save_hyperparameters()

    def pixeldp_scores(self, x: Tensor, n: int, generator: torch.Generator) -> Tensor:
        b, scale = len(x), self.hparams.noise_scale / self.hparams.psi
        repeated = x.unsqueeze(0).expand(2 * n, *x.shape).reshape(2 * n * b, *x.shape[1:])
        noisy = repeated + laplace(tuple(repeated.shape), scale, generator, x.device).to(x.dtype)
        probabilities = self(noisy).softmax(-1).reshape(2, n, b, -1)
        return probabilities[0] * probabilities[1]

    def pixeldp_radius_scale(self) -> float:
        return self.hparams.noise_scale / (2 * math.prod(self.hparams.input_shape))
