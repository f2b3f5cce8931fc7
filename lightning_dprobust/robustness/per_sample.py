"""Per-example robustness metrics of a classifier: input-gradient norm, input-Hessian top eigenvalue, local Lipschitz.

These are the per-sample metrics that Wu, Zhang, Bu, Lécuyer and Shokri (2023), "Augment then Smooth: Reconciling
Differential Privacy with Certified Robustness" (DP-CERT, https://arxiv.org/abs/2306.08656, Section 5) relate to
certified radii. All are computed for the cross-entropy loss (or the logits) of the model in eval mode, on a batch
whose examples are processed together for speed: every quantity is a derivative of a sum of per-example terms, so
example ``i``'s value depends only on example ``i`` as long as the model has no cross-example layer (BatchNorm in
eval mode is fine). The model's modes, ``requires_grad`` flags and parameter ``.grad`` are left as they were.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lightning_dprobust.robustness.attacks import attack_guard

_TINY = 1e-12


def _per_example(values: Tensor) -> Tensor:
    return values.flatten(1)


def _randn(like: Tensor, generator: torch.Generator | None) -> Tensor:
    device = generator.device if generator is not None else torch.device("cpu")
    return torch.randn(like.shape, generator=generator, dtype=like.dtype, device=device).to(like.device)


def _input_gradient(model: nn.Module, x: Tensor, y: Tensor, create_graph: bool) -> tuple[Tensor, Tensor]:
    x = x.detach().requires_grad_(True)
    loss = F.cross_entropy(model(x), y, reduction="sum")
    (gradient,) = torch.autograd.grad(loss, x, create_graph=create_graph)
    return x, gradient


def input_gradient_norm(model: nn.Module, x: Tensor, y: Tensor) -> Tensor:
    """``||grad_x CE(f(x_i), y_i)||_2`` for each example.

    Shape:
        x: ``[B, *S]`` in ``[0, 1]``; y: ``[B]``. Returns ``[B]``.
    """
    with attack_guard(model):
        model.eval()
        _, gradient = _input_gradient(model, x, y, create_graph=False)
    return _per_example(gradient).norm(dim=1).detach()


def input_hessian_top_eigenvalue(
    model: nn.Module,
    x: Tensor,
    y: Tensor,
    iters: int = 100,
    tol: float = 1e-5,
    generator: torch.Generator | None = None,
) -> Tensor:
    """Dominant eigenvalue of the input Hessian ``H_i = grad_x^2 CE(f(x_i), y_i)`` of each example.

    Power iteration on Hessian-vector products (double backward; Pearlmutter 1994): ``v <- H v / ||H v||``
    from a random start, reporting the Rayleigh quotient ``v^T H v``. It converges to the eigenvalue of largest
    magnitude (with its sign), whose absolute value is the spectral norm ``||H_i||_2`` that DP-CERT plots.
    Iteration stops after ``iters`` products or when every example's estimate changed by at most
    ``tol * max(1, |estimate|)``.

    Shape:
        x: ``[B, *S]``; y: ``[B]``. Returns ``[B]``.

    Raises:
        ValueError: if ``iters < 1``.
    """
    if iters < 1:
        raise ValueError(f"iters must be >= 1, got {iters}")
    with attack_guard(model):
        model.eval()
        x, gradient = _input_gradient(model, x, y, create_graph=True)
        v = _normalized(_randn(x, generator))
        estimate = torch.full((x.shape[0],), math.inf, dtype=x.dtype, device=x.device)
        for _ in range(iters):
            (product,) = torch.autograd.grad(gradient, x, grad_outputs=v, retain_graph=True)
            previous, estimate = estimate, _per_example(product * v).sum(dim=1)
            v = _normalized(product, fallback=v)
            if bool(((estimate - previous).abs() <= tol * estimate.abs().clamp(min=1.0)).all()):
                break
    return estimate.detach()


def _normalized(v: Tensor, fallback: Tensor | None = None) -> Tensor:
    norms = _per_example(v).norm(dim=1).view(-1, *([1] * (v.dim() - 1)))
    unit = v / norms.clamp_min(_TINY)
    return unit if fallback is None else torch.where(norms > 0, unit, fallback)


def local_lipschitz(
    model: nn.Module,
    x: Tensor,
    eps: float = 0.01,
    step_size: float = 0.003,
    steps: int = 10,
    init_std: float = 0.001,
    output_norm: float = 1.0,
    input_norm: float = math.inf,
    direction: Literal["ascent", "descent"] = "ascent",
    generator: torch.Generator | None = None,
) -> Tensor:
    """Empirical local Lipschitz constant ``max_{x' in B_inf(x, eps)} ||f(x') - f(x)|| / ||x' - x||`` per example.

    The estimator of Yang, Rashtchian, Zhang, Salakhutdinov and Chaudhuri 2020 (https://arxiv.org/abs/2003.02460),
    as used by DP-CERT: ``f`` are the logits, the output norm is L1 and the input norm Linf by default; ``x'``
    starts at ``x + init_std * N(0, I)`` and takes ``steps`` signed-gradient steps of ``step_size`` on the ratio,
    each followed by projection onto the Linf ball of radius ``eps`` and onto ``[0, 1]``. The ratio at the final
    ``x'`` is returned, a lower bound on the local Lipschitz constant.

    ``direction="ascent"`` (default) maximizes the ratio, as the definition requires. ``"descent"`` reproduces the
    sign of Yang et al.'s and DP-CERT's reference code, which steps *down* the ratio; use it only to compare with
    numbers produced by that code.

    Shape:
        x: ``[B, *S]`` in ``[0, 1]``. Returns ``[B]``.

    Raises:
        ValueError: for a non-positive ``eps``/``step_size``, negative ``steps`` or an unknown ``direction``.
    """
    if not (eps > 0 and step_size > 0 and steps >= 0 and init_std >= 0):
        raise ValueError(
            f"local_lipschitz needs eps > 0, step_size > 0, steps >= 0 and init_std >= 0, got eps={eps}, "
            f"step_size={step_size}, steps={steps}, init_std={init_std}"
        )
    if direction not in ("ascent", "descent"):
        raise ValueError(f"direction must be 'ascent' or 'descent', got {direction!r}")
    sign = 1.0 if direction == "ascent" else -1.0
    x = x.detach()
    with attack_guard(model):
        model.eval()
        reference = model(x).detach()

        def ratio(x_prime: Tensor) -> Tensor:
            top = _per_example(model(x_prime) - reference).norm(p=output_norm, dim=1)
            return top / _per_example(x_prime - x).norm(p=input_norm, dim=1).clamp_min(_TINY)

        x_prime = _project(x + init_std * _randn(x, generator), x, eps)
        for _ in range(steps):
            x_prime.requires_grad_(True)
            (gradient,) = torch.autograd.grad(ratio(x_prime).sum(), x_prime)
            x_prime = _project(x_prime.detach() + sign * step_size * gradient.sign(), x, eps)
        with torch.no_grad():
            return ratio(x_prime)


def _project(x_prime: Tensor, x: Tensor, eps: float) -> Tensor:
    return (x + (x_prime - x).clamp(-eps, eps)).clamp(0.0, 1.0)


__all__ = ["input_gradient_norm", "input_hessian_top_eigenvalue", "local_lipschitz"]
