"""StoBatch's DP adversarial examples: an l_inf ensemble (I-FGSM, MIM, PGD) crafted from perturbed inputs with the
model's predicted labels (Phan et al., ICML 2020, https://arxiv.org/abs/1903.09822, Eqs. 7-8 and Alg. 1 lines 7-11).

Everything here reads only the perturbed batch ``x_bar`` and the model, never the true labels nor the clean inputs,
so the adversarial batch is post-processing of the DP input layer (Appendix J, Result 4). For that reason the
examples are kept in the l_inf ball around ``x_bar`` but are *not* clipped to the valid range: ``x_bar`` itself lies
outside ``[-1, 1]``, and clipping ``x_bar - chi1 / m`` would read the clean input.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

Logits = Callable[[Tensor], Tensor]
ENSEMBLE = ("ifgsm", "mim", "pgd")
"""The attack ensemble ``A`` of every experiment in the paper (I-FGSM, MIM, MadryEtAl)."""


def _signed_gradient(model: Logits, x: Tensor, momentum: Tensor | None, decay: float) -> tuple[Tensor, Tensor | None]:
    """Sign of the loss gradient at ``x`` against the model's own prediction there (Eq. 8: ``y(x_adv_t)``)."""
    x = x.detach().requires_grad_(True)
    logits = model(x)
    loss = F.cross_entropy(logits, logits.argmax(-1).detach(), reduction="sum")
    (grad,) = torch.autograd.grad(loss, x)
    if momentum is None:
        return grad.sign(), None
    grad = grad / grad.abs().flatten(1).mean(1).clamp(min=1e-12).view(-1, *[1] * (grad.dim() - 1))
    momentum = decay * momentum + grad
    return momentum.sign(), momentum


def iterative_attack(
    model: Logits,
    x_bar: Tensor,
    mu: float,
    steps: int,
    kind: str,
    generator: torch.Generator | None = None,
    decay: float = 1.0,
) -> Tensor:
    """One ensemble member in ``l_inf(mu)`` around ``x_bar``: ``steps`` steps of size ``mu / steps`` (Appendix C).

    ``kind``: ``"ifgsm"`` (Kurakin et al.), ``"mim"`` (momentum, ``decay``; Dong et al.), ``"pgd"`` (uniform random
    start in the ball from ``generator``; Madry et al.).
    """
    if kind not in ENSEMBLE:
        raise ValueError(f"attack {kind!r} is not in the StoBatch ensemble {ENSEMBLE}")
    if steps < 1 or not mu >= 0:
        raise ValueError(f"an attack needs steps >= 1 and mu >= 0, got steps={steps}, mu={mu}")
    x_adv = x_bar.detach().clone()
    if kind == "pgd":
        start = torch.rand(x_bar.shape, generator=generator, device=x_bar.device, dtype=x_bar.dtype)
        x_adv = x_adv + mu * (2 * start - 1)
    momentum = torch.zeros_like(x_bar) if kind == "mim" else None
    for _ in range(steps):
        step, momentum = _signed_gradient(model, x_adv, momentum, decay)
        x_adv = x_bar + (x_adv + (mu / steps) * step - x_bar).clamp(-mu, mu)
    return x_adv.detach()


def ensemble_attack(
    model: Logits, x_bar: Tensor, mu: float, steps: int, generator: torch.Generator | None = None
) -> Tensor:
    """DP adversarial examples of a batch: consecutive sub-batches of size ``m / |A|`` go to I-FGSM, MIM and PGD.

    Returns a tensor shaped like ``x_bar``; example ``i`` depends on ``x_bar[i]`` and the model only.
    """
    parts = torch.tensor_split(torch.arange(len(x_bar), device=x_bar.device), len(ENSEMBLE))
    out = torch.empty_like(x_bar)
    for kind, index in zip(ENSEMBLE, parts, strict=True):
        if len(index):
            out[index] = iterative_attack(model, x_bar[index], mu, steps, kind, generator)
    return out
