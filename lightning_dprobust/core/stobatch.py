"""The math of StoBatch: Phan, Thai, Hu, Jin, Sun, Dou, "Scalable Differential Privacy with Certified Robustness in
Adversarial Learning", ICML 2020 (https://arxiv.org/abs/1903.09822).

Sensitivities (Lemmas 2 and 4), the privacy dividers ``gamma_x`` and ``gamma`` (Lemma 3), the total budget of
Theorem 4 and its splits (Appendix P), the Laplace draws, the two Taylor-approximated losses (Eqs. 6 and 9), the
fixed disjoint batches (Alg. 1 line 2, Alg. 4 line 4) with their membership map, and the certified-radius factor
(Eq. 13). Plain torch, no Lightning. Inputs live in the paper's ``[-1, 1]`` scale here; the LightningModule maps
``[0, 1]`` images to it.

The sensitivities, ``gamma``'s and budget below are the paper's; they do not make a proof (see the StoBatch method's
docstring): the epsilon they give is recorded as nominal, never as a differential-privacy guarantee.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
from torch import Tensor

BudgetSplit = Literal["mnist", "cifar10", "tiny_imagenet"]
BUDGET_SPLITS: tuple[str, ...] = ("mnist", "cifar10", "tiny_imagenet")
ReconstructionForm = Literal["linear", "absolute"]
LOG2 = math.log(2.0)


def reconstruction_sensitivity(patch_size: int, neurons: int) -> int:
    """``Delta_R = d (beta + 2)`` (Lemma 2): ``d`` inputs per hidden neuron (the patch ``C k k`` of a conv layer),
    ``beta`` hidden neurons (one feature map of a conv layer, Appendix P). Assumes ``x`` and ``h`` in ``[-1, 1]``."""
    if patch_size < 1 or neurons < 1:
        raise ValueError(f"patch_size and neurons must be >= 1, got {patch_size} and {neurons}")
    return int(patch_size) * (int(neurons) + 2)


def label_sensitivity(last_hidden: int) -> int:
    """``Delta_L2 = 2 |h_pi|`` (Lemma 4): one-hot labels and a last hidden layer in ``[-1, 1]``."""
    if last_hidden < 1:
        raise ValueError(f"last_hidden must be >= 1, got {last_hidden}")
    return 2 * int(last_hidden)


def gamma_x(delta_r: float, batch_size: int) -> float:
    """``gamma_x = Delta_R / m`` (Lemma 3, with the paper's ``Delta_x = 1``)."""
    return float(delta_r) / int(batch_size)


def gamma_h(delta_r: float, batch_size: int, delta_h: float) -> float:
    """``gamma = 2 Delta_R / (m Delta_h)`` (Lemma 3); ``Delta_h`` bounds the l1 change of ``h`` per unit change of one
    input coordinate (the projection of ``theta1`` keeps it below a constant, see :func:`project_theta1`)."""
    if not delta_h > 0:
        raise ValueError(f"delta_h must be > 0, got {delta_h}")
    return 2.0 * float(delta_r) / (int(batch_size) * float(delta_h))


def total_epsilon(epsilon1: float, epsilon2: float, gamma: float, gamma_x_: float) -> float:
    """``epsilon = epsilon1 + epsilon1 / gamma_x + epsilon1 / gamma + epsilon2`` (Theorem 4), independent of T."""
    return epsilon1 * (1.0 + 1.0 / gamma_x_ + 1.0 / gamma) + epsilon2


def split_budget(epsilon: float, split: BudgetSplit, gamma: float, gamma_x_: float) -> tuple[float, float]:
    """``(epsilon1, epsilon2)`` of a total ``epsilon`` by one of the paper's splits (Appendix P).

    ``mnist``: ``epsilon2 = 0.1``; ``cifar10``: ``epsilon = 2 + r``, ``epsilon2 = 1 + r / 3``; ``tiny_imagenet``:
    ``epsilon = 2 + r``, ``epsilon2 = 1``; ``epsilon1`` takes the rest, so :func:`total_epsilon` gives back
    ``epsilon``.

    Raises:
        ValueError: unknown split, or ``epsilon`` too small for it (mnist: > 0.1; the others: >= 2).
    """
    if split not in BUDGET_SPLITS:
        raise ValueError(f"budget_split={split!r} is unknown; choose one of {BUDGET_SPLITS}")
    floor = 0.1 if split == "mnist" else 2.0
    if not (math.isfinite(epsilon) and (epsilon > floor if split == "mnist" else epsilon >= floor)):
        raise ValueError(f"epsilon={epsilon!r} is too small for budget_split={split!r}: it needs epsilon > {floor:g}")
    divider = 1.0 + 1.0 / gamma + 1.0 / gamma_x_
    if split == "mnist":
        epsilon2 = 0.1
    else:
        epsilon2 = 1.0 + (epsilon - 2.0) / 3.0 if split == "cifar10" else 1.0
    return (epsilon - epsilon2) / divider, epsilon2


def laplace(shape: tuple[int, ...], scale: float, generator: torch.Generator) -> Tensor:
    """``Lap(0, scale)`` samples as the difference of two exponentials, from ``generator`` only (never finite-
    precision infinities: ``-log(1 - U)`` with ``U`` in ``[0, 1)`` is finite)."""
    if not scale > 0:
        raise ValueError(f"the Laplace scale must be > 0, got {scale}")
    u = torch.rand((2, *shape), generator=generator, dtype=torch.float64, device=generator.device)
    exponentials = -torch.log1p(-u)
    return (scale * (exponentials[0] - exponentials[1])).float()


def reconstruction_loss(x_bar: Tensor, x_tilde: Tensor, form: ReconstructionForm = "absolute") -> Tensor:
    """The first-order Taylor reconstruction loss on perturbed inputs, summed over examples and coordinates.

    ``linear`` is Eq. 6, ``sum (1/2 - x_bar) x_tilde`` (``log 2`` dropped); ``absolute`` is the per-element
    ``|log 2 + (1/2 - x_bar) x_tilde|`` of the authors' code (spec section 15 item 10), bounded below. Both read only
    the perturbed ``x_bar`` and the reconstruction from the perturbed hidden layer.
    """
    term = (0.5 - x_bar) * x_tilde
    if form == "linear":
        return term.sum()
    if form == "absolute":
        return (LOG2 + term).abs().sum()
    raise ValueError(f"reconstruction={form!r} is unknown; choose 'linear' or 'absolute'")


def taylor_cross_entropy(logits: Tensor, targets: Tensor) -> Tensor:
    """Second-order Taylor sigmoid cross-entropy, ``max(z, 0) - z y + log 2 - |z| / 2 + z^2 / 8`` per (example,
    class), summed (Appendix O, TensorFlow's form; spec section 5.3). ``targets`` is one-hot."""
    return (logits.clamp(min=0) - logits * targets + LOG2 - logits.abs() / 2 + logits.square() / 8).sum()


def label_noise_term(noise: Tensor, head_weight: Tensor) -> Tensor:
    """``sum_{j,k} chi3[j, k] W_pi[k, j]``: the Laplace noise of the label coefficients ``sum_i h_pi,i y_ik``.

    One draw ``chi3 ~ Lap(Delta_L2 / epsilon2)`` per coefficient for the batch sum (Lemma 4); ``head_weight`` is
    ``[K, |h_pi|]``."""
    return (noise * head_weight.t()).sum()


def fixed_disjoint_batches(num_examples: int, batch_size: int, generator: torch.Generator) -> Tensor:
    """``[N // m, m]`` example indices: one permutation cut into pairwise disjoint batches (the rest is dropped).

    Drawn once (Alg. 1 line 2); the same batches serve every epoch, which parallel composition needs (Theorem 4).
    """
    count = num_examples // batch_size
    if count < 2:
        raise ValueError(
            f"StoBatch needs at least 2 disjoint batches of batch_size={batch_size} (a benign and an adversarial "
            f"one per step), but the training set has {num_examples} examples: lower batch_size"
        )
    order = torch.randperm(num_examples, generator=generator, device=generator.device).cpu()
    return order[: count * batch_size].view(count, batch_size)


def batch_membership(batches: Tensor, num_examples: int) -> Tensor:
    """``[num_examples]`` long tensor: the number of the fixed batch each example belongs to, ``-1`` for an example
    left out of every batch (the rest of :func:`fixed_disjoint_batches`).

    Each example's input noise is the draw of its own batch (``StoBatch.draw_input_noise``), looked up through this
    map.
    """
    membership = torch.full((int(num_examples),), -1, dtype=torch.long)
    numbers = torch.arange(len(batches)).repeat_interleave(batches.shape[1])
    membership[batches.flatten().cpu()] = numbers
    return membership


def step_pairs(num_batches: int, world_size: int = 1, rank: int = 0) -> list[tuple[int, int]]:
    """``(benign, adversarial)`` batch indices of each step of one epoch of one trainer.

    One trainer (Alg. 1): step ``i`` takes batch ``i`` as benign and batch ``i + 1`` (cyclically) as the source of the
    adversarial examples. Several trainers (Alg. 4): the batches form fixed pairs ``(2j, 2j + 1)``; pair ``j`` belongs
    to trainer ``j mod world_size`` alone, and every trainer keeps the same number of pairs (extra pairs are unused).
    """
    if world_size == 1:
        return [(i, (i + 1) % num_batches) for i in range(num_batches)]
    per_rank = num_batches // 2 // world_size
    if per_rank < 1:
        raise ValueError(
            f"{num_batches} fixed batches cannot give each of {world_size} trainers a pair: lower batch_size"
        )
    return [(2 * j, 2 * j + 1) for j in range(rank, per_rank * world_size, world_size)]


def theta1_input_norm(weight: Tensor) -> Tensor:
    """``Delta_h`` of a conv layer ``[F, C, k, k]``: the largest l1 change of all its outputs when one input coordinate
    changes by 1, bounded by ``max_c sum_{f, a, b} |w[f, c, a, b]|`` (each tap meets one input pixel per output)."""
    return weight.abs().sum(dim=(0, 2, 3)).max()


@torch.no_grad()
def project_theta1(weight: Tensor, bound: float) -> None:
    """Scales each input channel's weights so that :func:`theta1_input_norm` stays ``<= bound`` (in place)."""
    norms = weight.abs().sum(dim=(0, 2, 3))
    weight.mul_((bound / norms.clamp(min=bound)).view(1, -1, 1, 1))


def radius_factor(delta_r: float, batch_size: int, epsilon1: float, delta_rx: float, delta_rh: float) -> float:
    """``Delta_R / (m epsilon1 (Delta_r^x + Delta_r^h / 2))`` (Eq. 13): radius per unit of ``epsilon_r``.

    Equals ``kappa phi / (kappa + phi)`` divided by ``epsilon_r`` (Corollary 1), with ``Delta_r^x`` and ``Delta_r^h``
    the l1 sensitivities of ``x`` and ``h`` to an input perturbation of unit size.
    """
    return float(delta_r) / (int(batch_size) * float(epsilon1) * (float(delta_rx) + float(delta_rh) / 2.0))
