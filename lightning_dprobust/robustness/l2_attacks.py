"""The L2 attack harness of TransDenoiser's evaluation (Tang 2021, thesis section 6.3.1): FGSM, I-FGSM, MIM and PGD
(MadryEtAl) with an L2 bound, crafted on the public classifier ``h`` alone (white box), as the authors ran cleverhans.

* FGSM (Goodfellow et al. 2015, https://arxiv.org/abs/1412.6572): one step of length ``eps`` along the normalized
  gradient;
* I-FGSM (Kurakin et al. 2017, https://arxiv.org/abs/1607.02533): ``steps`` such steps of ``eps_iter``;
* MIM (Dong et al. 2018, https://arxiv.org/abs/1710.06081): I-FGSM on the momentum
  ``m <- decay * m + grad / ||grad||_1``;
* PGD (Madry et al. 2018, https://arxiv.org/abs/1706.06083): I-FGSM from a uniformly random point of the ball.

Defaults follow the authors' cleverhans calls: ``eps_iter = eps / 10``, ``steps = 10``, ``decay = 1.0``. After every
step the image is clipped to ``[0, 1]`` and projected onto the L2 ball of radius ``eps`` around ``x``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

L2_METHODS = ("FGSM", "I-FGSM", "MIM", "PGD")
_TINY = 1e-12


def _per_example_norm(t: Tensor, p: int = 2) -> Tensor:
    return torch.linalg.vector_norm(t.flatten(1), ord=p, dim=1).clamp_min(_TINY).view(-1, *[1] * (t.dim() - 1))


def _project(x_adv: Tensor, x: Tensor, eps: float) -> Tensor:
    delta = x_adv.clamp(0.0, 1.0) - x
    delta = delta * (eps / _per_example_norm(delta)).clamp(max=1.0)
    return (x + delta).clamp(0.0, 1.0)


def _random_start(x: Tensor, eps: float, generator: torch.Generator | None) -> Tensor:
    direction = torch.randn(x.shape, generator=generator, device=x.device, dtype=x.dtype)
    direction = direction / _per_example_norm(direction)
    radius = eps * torch.rand((x.shape[0],), generator=generator, device=x.device, dtype=x.dtype)
    return _project(x + direction * radius.pow(1.0 / x[0].numel()).view(-1, *[1] * (x.dim() - 1)), x, eps)


def l2_attack(
    model: nn.Module,
    x: Tensor,
    y: Tensor,
    eps: float,
    method: str = "PGD",
    steps: int = 10,
    eps_iter: float | None = None,
    decay: float = 1.0,
    generator: torch.Generator | None = None,
) -> Tensor:
    """Untargeted L2 adversarial examples of ``model`` (logits of ``[0, 1]`` images) for the batch ``(x, y)``.

    Guarantees: ``||x' - x||_2 <= eps`` per example (up to float rounding) and ``x'`` in ``[0, 1]``; each example's
    perturbation depends on that example alone; ``model``'s parameters and mode are left as they were.

    Raises:
        ValueError: unknown ``method``, ``eps < 0``, ``steps < 1`` or ``eps_iter <= 0``.
    """
    if method not in L2_METHODS:
        raise ValueError(f"method={method!r} must be one of {L2_METHODS}")
    if not eps >= 0 or steps < 1 or (eps_iter is not None and not eps_iter > 0):
        raise ValueError(f"need eps >= 0, steps >= 1 and eps_iter > 0, got {eps}, {steps}, {eps_iter}")
    step, iterations = (eps, 1) if method == "FGSM" else (eps_iter or eps / 10, steps)
    was_training = model.training
    model.eval()
    x = x.detach()
    x_adv = _random_start(x, eps, generator) if method == "PGD" else x.clone()
    momentum = torch.zeros_like(x)
    try:
        for _ in range(iterations):
            x_adv.requires_grad_(True)
            (gradient,) = torch.autograd.grad(F.cross_entropy(model(x_adv), y, reduction="sum"), x_adv)
            if method == "MIM":
                momentum = decay * momentum + gradient / _per_example_norm(gradient, p=1)
                gradient = momentum
            x_adv = _project(x_adv.detach() + step * gradient / _per_example_norm(gradient), x, eps)
    finally:
        model.train(was_training)
    return x_adv.detach()


__all__ = ["L2_METHODS", "l2_attack"]
