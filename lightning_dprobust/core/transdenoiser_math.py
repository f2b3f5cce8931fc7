"""The mechanisms of TransDenoiser: Gaussian, multivariate Gaussian (MGM) and the input-to-gradient transformation.

Tang, "Deep Learning with Differential Privacy and Adversarial Robustness", PhD thesis, Emory University 2021,
chapter 6 and appendices .4-.13. Notation: ``w`` parameters in a slice, ``v`` input dimensions, ``C`` the
per-example clipping bound, ``sigma`` the std of the Gaussian input noise ``b`` (``z = x + b``), ``xi_up`` the
overall gradient noise multiplier the accountant is stepped with, ``T`` the total number of training steps.

* :func:`gaussian_sigma`: Theorem 1/6, ``sqrt(2 ln(1.25 / delta)) * sensitivity / epsilon`` for ``epsilon <= 1``.
* :func:`mgm_equivalent_sigma`: Theorem 3 / Corollary 1, ``N(0, M sigma^2)`` protects like ``N(0, S_min(M) sigma^2)``.
* :func:`taylor_remainders`: Algorithm 3 line 8, ``o_i = l(z_i) - l(x_i) - (z_i - x_i)^T grad_x l(x_i)``.
* :func:`transformation_matrix`: Lemma 1/5 and App. .9, ``M = (1 / C^2) sum_i a_i^2 A_i A_i^T`` with
  ``A_i = d/dx grad_theta l(x_i)`` (``w x v``) and ``a_i`` the clipping factor of example ``i``.
* :func:`top_up_multiplier`: Algorithm 3 line 16 (the thesis's quadrature rule, not the linear subtraction of the
  authors' code): ``sigma_bar^2 + T S_min(M) sigma^2 >= xi_up^2``.

Units: the rule compares noise multipliers of the clipped per-example gradient **sum**, whose sensitivity is ``C``;
the thesis's ``M_t = (1/B^2) sum A A^T`` is the covariance factor of the batch **mean**, whose sensitivity is
``C / B``, so dividing it by ``(C / B)^2`` gives exactly this ``M`` (the restated form of Lemma 4 uses
``S_min(M) sigma^2 / C^2`` in the same way).

Questionable steps of the thesis, reproduced as stated and not repaired: Lemma 1 compares gradient vectors with
"``>=``", which is not a DP argument; the factor ``T`` (Lemmas 2/3) assumes input noise drawn once, while Algorithm 3
draws it fresh at every step; the noise scale depends on the private batch through ``S_min``, which the thesis
deems acceptable because ``sigma_bar`` is never shown to anyone.

What the library records as a guarantee (DESIGN.md contract 12) is therefore not Theorem 5 but the Gaussian noise
actually added: ``TransDenoiserCallback`` accounts each step at the smallest ``sigma_bar`` over the slices and keeps
the thesis's claim (every step at ``xi_up``) beside it as nominal. With many steps the rule above gives
``sigma_bar = 0``: the transformed noise is then the only protection the thesis counts, and no finite epsilon follows.
"""

from __future__ import annotations

import math
import secrets
import warnings
from collections.abc import Callable, Mapping

import torch
from torch import Tensor
from torch.func import grad, jacfwd, vmap

from lightning_dprobust.core.sampling import keyed_generator

ExampleLoss = Callable[[Mapping[str, Tensor], Tensor, Tensor], Tensor]
"""``loss(slice_params, input, target) -> scalar`` of one example (no batch dimension)."""


def gaussian_sigma(epsilon: float, delta: float, sensitivity: float = 1.0) -> float:
    """Noise std of the classical Gaussian mechanism (Dwork and Roth 2014, Thm A.1; thesis Thm 1 and Thm 6).

    ``N(0, sigma^2)`` on each of ``w`` outputs of an L2-sensitivity-``sensitivity`` query is ``(epsilon, delta)``-DP
    for ``sigma >= sqrt(2 ln(1.25 / delta)) * sensitivity / epsilon``; the bound holds only for ``0 < epsilon <= 1``.

    Example:
        >>> round(gaussian_sigma(1.0, 1e-5), 4)
        4.8448
    """
    if not 0 < epsilon <= 1:
        raise ValueError(f"epsilon={epsilon!r} must lie in (0, 1]: the classical Gaussian mechanism bound needs it")
    if not 0 < delta < 1:
        raise ValueError(f"delta={delta!r} must lie in (0, 1)")
    if not sensitivity > 0:
        raise ValueError(f"sensitivity={sensitivity!r} must be > 0")
    return math.sqrt(2 * math.log(1.25 / delta)) * sensitivity / epsilon


def s_min(matrix: Tensor) -> float:
    """Smallest singular value of a symmetric PSD matrix (its smallest eigenvalue, clamped at 0; float64)."""
    if matrix.dim() != 2 or matrix.shape[0] != matrix.shape[1]:
        raise ValueError(f"expected a square matrix, got shape {tuple(matrix.shape)}")
    symmetric = 0.5 * (matrix + matrix.T).double()
    return max(0.0, float(torch.linalg.eigvalsh(symmetric)[0]))


def mgm_equivalent_sigma(matrix: Tensor, sigma: float) -> float:
    """Std of the Gaussian mechanism equivalent to ``N(0, matrix * sigma^2)`` (thesis Thm 3, Cor 1).

    With ``matrix = I`` this is ``sigma`` (the Gaussian mechanism); with a diagonal ``matrix = diag(s_i^2)`` it is
    ``sigma * min_i s_i``, the heterogeneous Gaussian mechanism's condition (Thm 7).
    """
    return math.sqrt(s_min(matrix)) * sigma


def top_up_multiplier(xi_up: float, xi_low: float, smin: float, sigma: float, steps: int) -> float:
    """``sigma_bar`` of Algorithm 3 line 16: the Gaussian noise multiplier added on top of the transformed noise.

    With ``s = sqrt(T * smin) * sigma`` (the transformed noise multiplier): ``xi_up`` when ``s < xi_low``,
    ``sqrt(xi_up^2 - T smin sigma^2)`` when ``xi_low <= s < xi_up``, and ``0`` when ``s >= xi_up``. Guarantee:
    ``sigma_bar^2 + T smin sigma^2 >= xi_up^2`` always (Theorem 4, MMGA).
    """
    if not (xi_up > 0 and 0 <= xi_low <= xi_up):
        raise ValueError(f"need 0 <= xi_low <= xi_up and xi_up > 0, got xi_low={xi_low!r}, xi_up={xi_up!r}")
    if smin < 0 or sigma < 0 or steps < 1:
        raise ValueError(f"need smin >= 0, sigma >= 0, steps >= 1; got {smin!r}, {sigma!r}, {steps!r}")
    transformed_sq = steps * smin * sigma**2
    transformed = math.sqrt(transformed_sq)
    if transformed < xi_low:
        return xi_up
    if transformed < xi_up:
        return math.sqrt(xi_up**2 - transformed_sq)
    return 0.0


def taylor_remainders(loss: Callable[[Tensor, Tensor], Tensor], x: Tensor, z: Tensor, loss_z: Tensor) -> Tensor:
    """``o_i = l(z_i) - (l(x_i) + (z_i - x_i)^T grad_x l(x_i))`` per example (Algorithm 3 line 8).

    Args:
        loss: ``loss(input, target) -> [B]`` per-example losses with the target held fixed; it must not mix
            examples, so the gradient of the summed loss is every example's own input gradient.
        x: ``[B, ...]`` clean inputs (also the targets).
        z: ``[B, ...]`` noisy inputs.
        loss_z: ``[B]`` the losses ``l(z_i)`` already computed on the noisy inputs.
    """
    with torch.enable_grad():
        clean = x.detach().requires_grad_(True)
        loss_x = loss(clean, x.detach())
        (grad_x,) = torch.autograd.grad(loss_x.sum(), clean)
    linear = ((z - x) * grad_x).flatten(1).sum(1)
    return loss_z.detach() - loss_x.detach() - linear.detach()


def input_jacobians(loss: ExampleLoss, params: Mapping[str, Tensor], x: Tensor, chunk_size: int = 1) -> Tensor:
    """``A_i = d/dx grad_theta l(x_i, theta)`` of each example, flattened to ``[B, w, v]`` (Lemma 1, App .12).

    ``theta`` is the slice ``params``; the input and the target are both ``x_i`` and the derivative is taken in
    the input with the target held fixed, as in the Taylor expansion of ``l(z)`` around ``x``.

    Memory: forward mode pushes all ``v`` input directions through the network at once, so one example holds ``v``
    copies of its activations (gigabytes per image for the shipped DnCNN: ``benchmarks/transdenoiser_jacobians.py``).
    ``chunk_size`` examples are differentiated at a time (default 1), so the peak is one example's whatever the batch.
    The result does not depend on ``chunk_size``.
    """

    def parameter_gradient(inputs: Tensor, target: Tensor) -> Tensor:
        grads = grad(loss)(params, inputs, target)
        return torch.cat([g.reshape(-1) for g in grads.values()])

    def example(xi: Tensor) -> Tensor:
        return jacfwd(parameter_gradient)(xi, xi).reshape(-1, xi.numel())

    return vmap(example, chunk_size=chunk_size)(x.detach())


def transformation_matrix(jacobians: Tensor, clip_factors: Tensor, max_grad_norm: float) -> Tensor:
    """``M = (1 / C^2) sum_i a_i^2 A_i A_i^T`` (``w x w``, symmetric PSD) from ``jacobians`` ``[B, w, v]``.

    ``sum_i a_i A_i b_i`` with ``b_i ~ N(0, sigma^2 I)`` is the transformed input noise in the clipped gradient sum
    (Lemma 5); its covariance is ``C^2 M sigma^2``, so ``sqrt(S_min(M)) sigma`` is its noise multiplier.
    """
    scaled = jacobians * clip_factors.view(-1, 1, 1)
    return torch.einsum("bwv,buv->wu", scaled, scaled) / max_grad_norm**2


def rank_allows(num_params: int, num_examples: int, input_dim: int) -> bool:
    """Rank guard: ``M`` has rank at most ``num_examples * input_dim``, so ``S_min(M) = 0`` when ``w`` exceeds it."""
    return 0 < num_params <= num_examples * input_dim


INPUT_NOISE_STREAM = "transdenoiser input noise"
"""Stream label of the input noise in :func:`~lightning_dprobust.core.sampling.keyed_generator`."""


def secret_generator(seed: int | None = None, device: torch.device | str = "cpu") -> torch.Generator:
    """A generator keyed by a 128-bit secret from the operating system's entropy (DESIGN.md contract 8).

    The whole generator state follows from the whole secret (:func:`~lightning_dprobust.core.sampling.keyed_generator`):
    ``torch.Generator().manual_seed(secret)`` would keep only its low 32 bits on CPU, a stream one could find by search.

    ``seed`` is a test mode only: it makes the noise replayable, which voids the guarantee, and warns.
    """
    if seed is not None:
        warnings.warn(
            f"noise seed {seed} is fixed: the privacy noise is replayable and the DP guarantee does not hold; "
            "use it in tests only",
            stacklevel=2,
        )
    key = secrets.randbits(128) if seed is None else int(seed)
    return keyed_generator(device, key, INPUT_NOISE_STREAM)


__all__ = [
    "INPUT_NOISE_STREAM",
    "gaussian_sigma",
    "input_jacobians",
    "mgm_equivalent_sigma",
    "rank_allows",
    "s_min",
    "secret_generator",
    "taylor_remainders",
    "top_up_multiplier",
    "transformation_matrix",
]
