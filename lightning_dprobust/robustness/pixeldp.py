"""PixelDP certified inference (Lecuyer et al. 2019) for mechanisms such as StoBatch's (Phan et al. 2020, Alg. 3).

A model certified here implements :class:`PixelDPMechanism`: it draws ``n`` Monte-Carlo scores per input (for
StoBatch the composed ``p_x * p_h`` of an input and a latent Laplace mechanism, Eq. 11) and states how many units of
radius one unit of ``epsilon_r`` buys. :func:`certify_pixeldp` turns the draws into confidence bounds, the
robustness size ``epsilon_r*``, the radius and the robust flag of Algorithm 3; :func:`pixeldp_metrics` reports
conventional and certified accuracy with the library's torchmetrics. The math lives in
:mod:`lightning_dprobust.core.pixeldp`.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from numbers import Real
from typing import Protocol, runtime_checkable

import torch
from torch import Tensor, nn
from tqdm.auto import tqdm

from lightning_dprobust.core.pixeldp import (
    certified_radius,
    check_options,
    robustness_size,
    top_two_bounds,
)
from lightning_dprobust.metrics import CertifiedAccuracy, RobustAccuracy
from lightning_dprobust.robustness.attacks import preserve_modes


@runtime_checkable
class PixelDPMechanism(Protocol):
    """A randomized classifier whose scores are PixelDP with respect to l_inf input perturbations.

    Attributes:
        pixeldp_attack_norm: the norm of the perturbations the radius is for; ``"linf"``.
    """

    pixeldp_attack_norm: str

    def pixeldp_scores(self, x: Tensor, n: int, generator: torch.Generator) -> Tensor:
        """``[n, B, K]`` scores in ``[0, 1]`` for ``x`` (``[B, ...]`` in ``[0, 1]``): ``n`` independent draws of the
        mechanism's fresh noise, all taken from ``generator`` (never the global RNG), in eval mode without grad."""
        ...

    def pixeldp_radius_scale(self) -> float:
        """The Eq. 13 factor ``Delta_R / (m epsilon1 (Delta_r^x + Delta_r^h / 2))``: the l_inf radius per unit of
        ``epsilon_r``, so that ``radius = epsilon_r* * pixeldp_radius_scale()``.

        Units: the radius is compared with attack sizes ``mu_a`` in the units of ``x`` (``[0, 1]`` pixels), so the
        sensitivities ``Delta_r^x`` and ``Delta_r^h`` are those of the unit l_inf ball in those units (a model that
        works in ``[-1, 1]`` internally sees that ball as one of radius 2). The noise scales are those of the fresh
        inference noise before any shrink factor ``psi``."""
        ...


@dataclass(frozen=True)
class PixelDPCertificates:
    """Per-example outcome of :func:`certify_pixeldp`, all tensors of shape ``[B]`` on the CPU.

    Attributes:
        prediction: ``argmax`` of the estimate (long); PixelDP never abstains.
        epsilon_r: robustness size ``epsilon_r*`` (float64, ``0`` when the bounds overlap).
        radius: certified l_inf radius in the units of ``x`` (float64).
        robust: ``radius >= mu_a`` (Algorithm 3).
        correct: ``prediction == y``.
    """

    prediction: Tensor
    epsilon_r: Tensor
    radius: Tensor
    robust: Tensor
    correct: Tensor


def certify_pixeldp(
    mechanism: PixelDPMechanism,
    x: Tensor,
    y: Tensor,
    *,
    n: int,
    eta: float = 0.05,
    mu_a: float = 0.0,
    bound: str = "clopper_pearson",
    condition: str = "paper",
    psi: float = 1.0,
    generator: torch.Generator | None = None,
    seed: int = 0,
    batch_size: int = 1000,
    progress: bool = False,
) -> PixelDPCertificates:
    """Verified inference (Phan et al. 2020, Algorithm 3; Lecuyer et al. 2019, Sec. IV) of every example of ``x``.

    Per example: ``n`` draws of ``mechanism.pixeldp_scores``; the argmax counts (``clopper_pearson``) or the mean
    scores (``hoeffding``); the prediction ``k`` and the bounds ``E_lb f_k`` and ``max_{i != k} E_ub f_i``, jointly
    valid with probability ``>= 1 - eta`` (see :mod:`lightning_dprobust.core.pixeldp` for the ``condition``);
    ``epsilon_r* = ln(E_lb / E_ub) / 2``; ``radius = epsilon_r* * mechanism.pixeldp_radius_scale()`` (divided by
    ``psi`` in ``strict`` mode); robust iff ``radius >= mu_a``.

    Reproducibility: every draw comes from ``generator`` (or, when ``None``, from a new generator on ``x``'s device
    seeded with ``seed``); the global RNG is neither read nor advanced. Examples are processed in chunks of at most
    ``batch_size`` and draws in chunks of ``max(1, batch_size // examples)``, so results depend on ``batch_size``.

    Args:
        mechanism: the model, implementing :class:`PixelDPMechanism`; put in eval mode for the call, then restored.
        x: ``[B, ...]`` inputs in ``[0, 1]``.
        y: ``[B]`` integer labels (only used for ``correct``).
        n: Monte-Carlo draws per example, ``>= 1``.
        eta: failure probability of each certificate, in ``(0, 1)``.
        mu_a: attack size for the robust flag, in the units of ``x``.
        bound: ``"clopper_pearson"`` (argmax counts) or ``"hoeffding"`` (expected scores).
        condition: ``"paper"`` or ``"strict"``.
        psi: the mechanism's fresh-noise shrink factor (used by ``strict`` only).
        generator: the source of every draw.
        seed: seed of the generator made when ``generator`` is ``None``.
        batch_size: noisy inputs per ``pixeldp_scores`` call (examples times draws).
        progress: show a tqdm progress bar over examples.

    Raises:
        TypeError: ``mechanism`` does not implement :class:`PixelDPMechanism`.
        ValueError: bad arguments, or scores of the wrong shape or outside ``[0, 1]``.
    """
    check_options(n, eta, bound, condition, psi)
    _check_inputs(mechanism, x, y, mu_a, batch_size)
    scale = mechanism.pixeldp_radius_scale()
    if isinstance(scale, bool) or not isinstance(scale, Real) or not math.isfinite(scale) or scale <= 0:
        raise ValueError(f"pixeldp_radius_scale() must return a finite number > 0, got {scale!r}")
    if generator is None:
        generator = torch.Generator(device=x.device).manual_seed(seed)
    estimates = []
    with _eval_mode(mechanism), tqdm(total=len(x), desc="pixeldp", unit="example", disable=not progress) as bar:
        for start in range(0, len(x), batch_size):
            chunk = x[start : start + batch_size]
            estimates.append(_estimate(mechanism, chunk, n, bound, generator, batch_size))
            bar.update(len(chunk))
    prediction, lower, upper = top_two_bounds(torch.cat(estimates), n, eta, bound, condition)
    epsilon_r = robustness_size(lower, upper)
    radius = certified_radius(epsilon_r, float(scale), condition, psi)
    return PixelDPCertificates(prediction, epsilon_r, radius, radius >= mu_a, prediction == y.cpu())


def _estimate(
    mechanism: PixelDPMechanism, x: Tensor, n: int, bound: str, generator: torch.Generator, batch_size: int
) -> Tensor:
    """Argmax counts (long) or summed-then-averaged scores (float64) of ``n`` draws, ``[B, K]`` on the CPU."""
    total, done, draws = None, 0, max(1, batch_size // len(x))
    while done < n:
        size = min(draws, n - done)
        with torch.inference_mode():
            scores = mechanism.pixeldp_scores(x, size, generator)
        _check_scores(scores, size, len(x), None if total is None else total.shape[1])
        if bound == "hoeffding":
            part = scores.double().sum(0).cpu()
        else:
            part = nn.functional.one_hot(scores.argmax(-1), scores.shape[-1]).sum(0).cpu()
        total = part if total is None else total + part
        done += size
    return (total / n).clamp(0.0, 1.0) if bound == "hoeffding" else total  # clamp: rounding of the sum


def pixeldp_metrics(certificates: PixelDPCertificates, targets: Tensor, mu_a: Sequence[float]) -> dict[str, float]:
    """Conventional accuracy and certified accuracy at each attack size (Phan et al. 2020, Sec. 4, as Lecuyer et al.).

    ``conventional_acc`` is :class:`~lightning_dprobust.metrics.RobustAccuracy` of the predictions (accuracy under
    attack when the inputs were attacked); ``certified_acc@<mu>`` is
    :class:`~lightning_dprobust.metrics.CertifiedAccuracy` at radius ``mu``: correct and ``radius >= mu``.
    """
    conventional, certified = RobustAccuracy(), CertifiedAccuracy(radii=mu_a)
    conventional.update(certificates.prediction, targets.cpu())
    certified.update(certificates.prediction, certificates.radius, targets.cpu())
    values = certified.compute().reshape(-1)  # torchmetrics squeezes a single radius to a scalar
    return {"conventional_acc": float(conventional.compute())} | {
        f"certified_acc@{mu:g}": float(v) for mu, v in zip(certified.radii, values, strict=True)
    }


def _check_inputs(mechanism: object, x: Tensor, y: Tensor, mu_a: float, batch_size: int) -> None:
    if not isinstance(mechanism, PixelDPMechanism):
        raise TypeError(
            f"{type(mechanism).__name__} does not implement PixelDPMechanism (pixeldp_scores, pixeldp_radius_scale, "
            "pixeldp_attack_norm): PixelDP certifies a model that injects its own DP noise, such as StoBatch"
        )
    if mechanism.pixeldp_attack_norm != "linf":
        raise ValueError(f"pixeldp_attack_norm must be 'linf', got {mechanism.pixeldp_attack_norm!r}")
    if not isinstance(x, Tensor) or not x.is_floating_point() or x.dim() < 2 or len(x) == 0:
        raise ValueError("x must be a non-empty floating-point batch [B, ...] of inputs in [0, 1]")
    if x.min() < 0 or x.max() > 1:
        raise ValueError(f"x must lie in [0, 1] (unnormalized pixels), got values in [{x.min():g}, {x.max():g}]")
    if not isinstance(y, Tensor) or y.shape != (len(x),) or y.is_floating_point():
        raise ValueError(f"y must be integer labels of shape ({len(x)},), got {getattr(y, 'shape', type(y))}")
    if not mu_a >= 0:
        raise ValueError(f"mu_a must be a number >= 0 (the attack size), got {mu_a!r}")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be an integer >= 1, got {batch_size!r}")


def _check_scores(scores: Tensor, n: int, batch: int, num_classes: int | None) -> None:
    if not isinstance(scores, Tensor) or scores.dim() != 3 or scores.shape[:2] != (n, batch):
        shape = tuple(scores.shape) if isinstance(scores, Tensor) else type(scores).__name__
        raise ValueError(f"pixeldp_scores must return [n={n}, B={batch}, K] scores, got {shape}")
    if scores.shape[2] < 2 or (num_classes is not None and scores.shape[2] != num_classes):
        raise ValueError(f"pixeldp_scores returned {scores.shape[2]} classes, expected the same K >= 2 on every call")
    if not scores.is_floating_point() or not ((scores >= 0) & (scores <= 1)).all():
        raise ValueError("pixeldp_scores must return floating-point scores in [0, 1] (e.g. products of softmaxes)")


@contextmanager
def _eval_mode(mechanism: object) -> Iterator[None]:
    """Eval mode for an ``nn.Module`` mechanism; every submodule's mode is restored on exit."""
    if not isinstance(mechanism, nn.Module):
        yield
        return
    with preserve_modes(mechanism):
        mechanism.eval()
        yield
