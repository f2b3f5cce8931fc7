"""Randomized smoothing with Gaussian noise: PREDICT and CERTIFY.

Cohen, Rosenfeld and Kolter (2019), "Certified Adversarial Robustness via Randomized Smoothing", ICML,
https://arxiv.org/abs/1902.02918.

The smoothed classifier ``g(x) = argmax_c P(f(x + eps) = c)``, ``eps ~ N(0, sigma^2 I)``, built from a base
classifier ``f``, is robust within the L2 ball of radius ``sigma * PhiInv(p_A)`` around ``x`` whenever the top class
has probability ``p_A >= 1/2`` under noise (the paper's Theorem 1 with ``p_B = 1 - p_A``).

Noise is added in the input's own coordinates, which by the library's data contract are unnormalized pixels in
``[0, 1]``: normalization is the model's first layer, so ``sigma`` and the radius are in pixel units.

Random draws follow the published algorithm (``locuslab/smoothing``, ``code/core.py``) call for call. One call of
``certify(x, n0, n, alpha, batch_size)`` makes ``ceil(n0 / batch_size)`` selection draws followed by
``ceil(n / batch_size)`` estimation draws from the same generator; each draw is one standard-normal fill of shape
``(b, *x.shape)`` in ``x.dtype`` on ``x.device``, where ``b = min(batch_size, remaining)`` and ``remaining`` starts
at ``n0`` (respectively ``n``) and decreases by ``b`` after each draw: all full batches first, then one remainder
batch. Noisy inputs are ``x + sigma * z``, rounded exactly as the reference rounds them (first ``sigma * z``, then
the sum). ``predict`` makes the ``ceil(n / batch_size)`` draws of one estimation pass. Nothing else consumes
randomness, so with the same generator state, batch size, device and model, predictions, counts and radii equal
the reference's.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from numbers import Integral, Real

import torch
from scipy.stats import beta, binomtest, norm
from torch import Tensor, nn

ABSTAIN = -1
"""Prediction returned when the smoothed classifier abstains."""


@dataclass(frozen=True)
class Certificate:
    """Outcome of :meth:`Smooth.certify` for one input.

    Attributes:
        prediction: the certified class, or :data:`ABSTAIN` (``-1``).
        radius: certified L2 radius in input units; ``0.0`` when abstaining.
        count: estimation votes ``n_A`` for the class chosen by the selection draws.
        p_lower: one-sided Clopper-Pearson lower confidence bound on ``p_A`` computed from ``count``.
    """

    prediction: int
    radius: float
    count: int
    p_lower: float

    @property
    def abstained(self) -> bool:
        """Whether the smoothed classifier abstained on this input."""
        return self.prediction == ABSTAIN


def lower_confidence_bound(count: int, n: int, alpha: float) -> float:
    """One-sided ``(1 - alpha)`` Clopper-Pearson lower bound on a binomial success probability.

    Equals ``statsmodels.stats.proportion.proportion_confint(count, n, alpha=2 * alpha, method="beta")[0]``
    (Clopper and Pearson, 1934), the bound used by Cohen et al. (2019, arXiv:1902.02918).

    Args:
        count: number of successes, ``0 <= count <= n``.
        n: number of trials, ``n >= 1``.
        alpha: failure probability, ``0 < alpha < 1``.

    Returns:
        ``p`` such that ``P(true probability >= p) >= 1 - alpha``; ``0.0`` when ``count == 0``.

    Raises:
        ValueError: if an argument is outside the ranges above.
    """
    _check_positive_int(n=n)
    _check_alpha(alpha)
    if isinstance(count, bool) or int(count) != count or not 0 <= count <= n:
        raise ValueError(f"count must be an integer in [0, n={n}], got {count!r}")
    if count == 0:
        return 0.0
    return float(beta.ppf(alpha, count, n - count + 1))


def certified_radius(p_lower: float, sigma: float) -> float:
    """Certified L2 radius ``sigma * PhiInv(p_lower)`` of Cohen et al. (2019, arXiv:1902.02918), Theorem 1.

    Args:
        p_lower: lower bound on the top-class probability under noise, in ``[1/2, 1]``.
        sigma: standard deviation of the Gaussian noise, positive and finite.

    Returns:
        The radius; ``0.0`` at ``p_lower = 1/2`` and ``inf`` at ``p_lower = 1``.

    Raises:
        ValueError: if ``p_lower < 1/2`` (no certificate: the smoothed classifier abstains) or ``p_lower > 1``, or if
            ``sigma`` is not positive and finite.
    """
    _check_sigma(sigma)
    if not 0.5 <= p_lower <= 1.0:
        raise ValueError(
            f"p_lower must lie in [0.5, 1], got {p_lower!r}: below 1/2 the smoothed classifier abstains and no "
            "radius is certified"
        )
    return float(sigma * norm.ppf(p_lower))


class Smooth:
    """Smoothed classifier ``g`` around a base classifier ``f`` (Cohen et al. 2019, arXiv:1902.02918).

    Args:
        base_classifier: maps a batch ``(B, *input_shape)`` of unnormalized inputs to logits ``(B, num_classes)``;
            it must live on the device of the inputs it is given. It is run in eval mode under
            ``torch.inference_mode`` and its previous mode is restored afterwards.
        num_classes: number of classes of ``f``, at least 2.
        sigma: standard deviation of the Gaussian noise in input units, positive and finite.

    Guarantees:
        ``certify`` returns either :data:`ABSTAIN` or a class that, with probability at least ``1 - alpha`` over
        its noise draws, equals ``g(x)``, with ``g`` constant on the L2 ball of the returned radius around ``x``.
        ``predict`` returns :data:`ABSTAIN` or ``g(x)``; it returns a class other than ``g(x)`` with probability at
        most ``alpha`` (Hung et al. 2019, arXiv:1610.03944). Both assume that the noise is the only randomness:
        ``f`` must be deterministic in eval mode.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> f = nn.Linear(2, 2)
        >>> with torch.no_grad():
        ...     _ = f.weight.copy_(torch.tensor([[1.0, 0.0], [-1.0, 0.0]]))
        ...     _ = f.bias.zero_()
        >>> smooth = Smooth(f, num_classes=2, sigma=0.25)
        >>> cert = smooth.certify(torch.tensor([0.5, 0.0]), n0=100, n=1000, alpha=0.001, batch_size=400,
        ...                       generator=torch.Generator().manual_seed(0))
        >>> cert.prediction, 0.3 < cert.radius < 0.5
        (0, True)
    """

    ABSTAIN = ABSTAIN

    def __init__(self, base_classifier: nn.Module, num_classes: int, sigma: float) -> None:
        if not isinstance(num_classes, int) or num_classes < 2:
            raise ValueError(f"num_classes must be an integer >= 2, got {num_classes!r}")
        _check_sigma(sigma)
        self.base_classifier = base_classifier
        self.num_classes = num_classes
        self.sigma = float(sigma)

    def certify(
        self, x: Tensor, n0: int, n: int, alpha: float, batch_size: int, generator: torch.Generator | None = None
    ) -> Certificate:
        """CERTIFY of Cohen et al. (2019): select the top class with ``n0`` draws, bound ``p_A`` with ``n`` more.

        Args:
            x: one input without batch dimension, e.g. ``(C, H, W)`` in ``[0, 1]``.
            n0: number of selection draws.
            n: number of estimation draws.
            alpha: failure probability of the certificate.
            batch_size: noisy inputs per forward pass; it fixes the shapes of the noise draws.
            generator: source of the noise, on ``x.device``; the device's default generator if ``None``.

        Returns:
            The :class:`Certificate`; abstains when the lower bound on ``p_A`` is below 1/2.
        """
        _check_positive_int(n0=n0, n=n)
        _check_alpha(alpha)
        selection = self.sample_counts(x, n0, batch_size, generator)
        top = int(selection.argmax())  # first index among ties, as numpy's argmax in the reference
        estimation = self.sample_counts(x, n, batch_size, generator)
        count = int(estimation[top])
        p_lower = lower_confidence_bound(count, n, alpha)
        if p_lower < 0.5:
            return Certificate(ABSTAIN, 0.0, count, p_lower)
        return Certificate(top, certified_radius(p_lower, self.sigma), count, p_lower)

    def predict(
        self, x: Tensor, n: int, alpha: float, batch_size: int, generator: torch.Generator | None = None
    ) -> int:
        """PREDICT of Cohen et al. (2019): the top class, unless a two-sided binomial test on the top-2 counts fails.

        Args:
            x: one input without batch dimension.
            n: number of noise draws.
            alpha: bound on the probability of returning a class other than ``g(x)``.
            batch_size: noisy inputs per forward pass.
            generator: source of the noise, on ``x.device``; the device's default generator if ``None``.

        Returns:
            The predicted class, or :data:`ABSTAIN` when ``binomtest(n1, n1 + n2, 0.5).pvalue > alpha``.
        """
        _check_alpha(alpha)
        counts = self.sample_counts(x, n, batch_size, generator).cpu()
        top2 = torch.topk(counts, 2)
        count1, count2 = (int(c) for c in top2.values)
        if binomtest(count1, count1 + count2, p=0.5).pvalue > alpha:
            return ABSTAIN
        return int(top2.indices[0])

    def sample_counts(self, x: Tensor, num: int, batch_size: int, generator: torch.Generator | None = None) -> Tensor:
        """Class counts of ``f(x + N(0, sigma^2 I))`` over ``num`` draws (``_sample_noise`` in the reference).

        Args:
            x: one input without batch dimension, floating point.
            num: number of noisy copies to classify.
            batch_size: noisy copies per forward pass and per noise draw.
            generator: source of the noise, on ``x.device``; the device's default generator if ``None``.

        Returns:
            ``int64`` tensor of shape ``(num_classes,)`` on ``x.device``, summing to ``num``.
        """
        _check_positive_int(num=num, batch_size=batch_size)
        self._check_input(x, generator)
        counts = torch.zeros(self.num_classes, dtype=torch.int64, device=x.device)
        size = min(batch_size, num)
        noisy_buffer = torch.empty((size, *x.shape), dtype=x.dtype, device=x.device)
        ones = torch.ones(size, dtype=torch.int64, device=x.device)
        with _eval_mode(self.base_classifier), torch.inference_mode():
            for size in _batch_sizes(num, batch_size):
                noisy = noisy_buffer[:size]
                noisy.normal_(0.0, self.sigma, generator=generator).add_(x)
                logits = self.base_classifier(noisy)
                self._check_logits(logits, size)
                # scatter_add_ rather than bincount: bincount reads the maximum back to the host on CUDA.
                counts.scatter_add_(0, logits.argmax(1), ones[:size])
        return counts

    def _check_input(self, x: Tensor, generator: torch.Generator | None) -> None:
        if not isinstance(x, Tensor) or not x.is_floating_point():
            raise TypeError(f"x must be a floating-point tensor (one input in [0, 1]), got {type(x).__name__}")
        if generator is not None and generator.device.type != x.device.type:
            raise ValueError(
                f"generator is on {generator.device} but x is on {x.device}: create it with "
                f"torch.Generator(device=x.device)"
            )

    def _check_logits(self, logits: Tensor, size: int) -> None:
        if logits.shape != (size, self.num_classes):
            raise ValueError(
                f"base_classifier returned shape {tuple(logits.shape)} for {size} inputs, expected "
                f"({size}, {self.num_classes}): pass x without batch dimension and set num_classes to the number "
                "of logits"
            )


def _batch_sizes(num: int, batch_size: int) -> Iterator[int]:
    """Batch sizes of the reference loop: ``ceil(num / batch_size)`` batches, full ones first."""
    remaining = num
    while remaining > 0:
        size = min(batch_size, remaining)
        remaining -= size
        yield size


@contextmanager
def _eval_mode(module: nn.Module) -> Iterator[None]:
    was_training = module.training
    module.eval()
    try:
        yield
    finally:
        module.train(was_training)


def _check_sigma(sigma: float) -> None:
    if isinstance(sigma, bool) or not isinstance(sigma, Real) or not math.isfinite(sigma) or sigma <= 0:
        raise ValueError(f"sigma must be a positive finite number (noise std in input units), got {sigma!r}")


def _check_alpha(alpha: float) -> None:
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must lie in (0, 1), got {alpha!r}; Cohen et al. use alpha=0.001")


def _check_positive_int(**values: int) -> None:
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, Integral) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
