"""The reversibility toy of residual perturbation (Tao et al., ICLR 2021 submission, section 2.1 and Fig. 1).

A ResNet is a forward-Euler discretisation of ``dx = F(x) dt``; that ODE can be integrated backwards, so the input
is recoverable from the features. With the SDE ``dx = F(x) dt + gamma dB`` (Euler-Maruyama, std
``gamma sqrt(dt)`` per step, fresh noise in each direction) it is not. Framework-free (numpy only).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

Velocity = Callable[[np.ndarray], np.ndarray]


def _step_noise(shape: tuple[int, ...], gamma: float, dt: float, rng: np.random.Generator) -> np.ndarray:
    return gamma * np.sqrt(dt) * rng.standard_normal(shape) if gamma > 0 else np.zeros(shape)


def integrate(
    x: np.ndarray, velocity: Velocity, steps: int, dt: float, gamma: float, rng: np.random.Generator, sign: int
) -> np.ndarray:
    """``steps`` Euler(-Maruyama) steps ``x <- x + sign * dt * F(x) + gamma sqrt(dt) n`` (``sign=-1``: backwards)."""
    if steps < 1 or not dt > 0 or gamma < 0 or sign not in (1, -1):
        raise ValueError(f"need steps >= 1, dt > 0, gamma >= 0 and sign +-1, got {steps}, {dt}, {gamma}, {sign}")
    for _ in range(steps):
        x = x + sign * dt * velocity(x) + _step_noise(x.shape, gamma, dt, rng)
    return x


def recovery_error(
    image: np.ndarray, velocity: Velocity, gamma: float, steps: int = 100, dt: float = 0.01, seed: int | None = None
) -> float:
    """Relative l2 error ``||x~(0) - x(0)|| / ||x(0)||`` of integrating forward to ``t = steps dt`` and back."""
    rng = np.random.default_rng(seed)
    features = integrate(image, velocity, steps, dt, gamma, rng, 1)
    recovered = integrate(features, velocity, steps, dt, gamma, rng, -1)
    return float(np.linalg.norm(recovered - image) / np.linalg.norm(image))


def permutation_velocity(shape: tuple[int, ...], seed: int = 0) -> Velocity:
    """A pixel-permutation field ``F(x) = x[perm]`` (any such warp shows the point of the paper's Appendix E)."""
    perm = np.random.default_rng(seed).permutation(int(np.prod(shape)))
    return lambda x: x.reshape(-1)[perm].reshape(x.shape)
