"""Per-example metrics against one-at-a-time and full-Hessian references; per-example independence."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from lightning_dprobust.models import create_model
from lightning_dprobust.robustness.per_sample import input_gradient_norm, input_hessian_top_eigenvalue, local_lipschitz


def digits_model() -> nn.Module:
    torch.manual_seed(0)
    return create_model("cnn_tanh", num_classes=10, input_shape=(1, 8, 8), mean=(0.3,), std=(0.4,)).eval()


def tiny_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3)).double().eval()


def batch(size: int = 12, shape=(1, 8, 8), dtype=torch.float32, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    return torch.rand(size, *shape, generator=gen, dtype=dtype), torch.randint(0, 3, (size,), generator=gen)


def test_input_gradient_norm_matches_one_example_at_a_time():
    model = digits_model()
    x, y = batch()
    expected = []
    for i in range(len(x)):
        xi = x[i : i + 1].clone().requires_grad_(True)
        (gradient,) = torch.autograd.grad(F.cross_entropy(model(xi), y[i : i + 1]), xi)
        expected.append(gradient.norm())
    torch.testing.assert_close(input_gradient_norm(model, x, y), torch.stack(expected))


def test_hessian_top_eigenvalue_matches_the_full_hessian_spectrum():
    model = tiny_model()
    x, y = batch(size=6, shape=(1, 2, 3), dtype=torch.float64)
    estimate = input_hessian_top_eigenvalue(
        model, x, y, iters=2000, tol=1e-12, generator=torch.Generator().manual_seed(0)
    )
    for i in range(len(x)):

        def loss(xi, i=i):
            return F.cross_entropy(model(xi.view(1, 1, 2, 3)), y[i : i + 1])

        hessian = torch.autograd.functional.hessian(loss, x[i].flatten())
        eigenvalues = torch.linalg.eigvalsh(hessian)
        dominant = eigenvalues[eigenvalues.abs().argmax()]
        assert estimate[i].item() == pytest.approx(dominant.item(), rel=1e-6, abs=1e-9)


def test_lipschitz_estimate_beats_random_points_in_the_ball_and_the_reference_sign():
    model = digits_model()
    x, _ = batch(size=16)
    eps = 0.01
    ascent = local_lipschitz(model, x, eps=eps, generator=torch.Generator().manual_seed(0))
    descent = local_lipschitz(model, x, eps=eps, direction="descent", generator=torch.Generator().manual_seed(0))
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        fx = model(x)
        for _ in range(32):
            x_prime = (x + eps * (2 * torch.rand(x.shape, generator=gen) - 1)).clamp(0, 1)
            ratio = (model(x_prime) - fx).abs().sum(1) / (x_prime - x).flatten(1).abs().max(1).values
            assert bool((ascent >= ratio).all())
    assert bool((ascent > descent).all())


def test_lipschitz_of_a_linear_map_is_bounded_by_its_induced_norm():
    # f(x) = W x with L1 on outputs and Linf on inputs: every ratio is at most max over sign vectors s of ||W s||_1
    # (a convex function is maximized at a corner of the box); signed-gradient ascent gets close to it.
    torch.manual_seed(0)
    linear = nn.Linear(6, 3, bias=False)
    model = nn.Sequential(nn.Flatten(), linear).eval()
    corners = torch.cartesian_prod(*[torch.tensor([-1.0, 1.0])] * 6)
    bound = (corners @ linear.weight.detach().T).abs().sum(1).max()
    x = torch.full((4, 1, 2, 3), 0.5)
    estimate = local_lipschitz(model, x, eps=0.01, steps=20, generator=torch.Generator().manual_seed(0))
    assert bool((estimate <= bound * (1 + 1e-5)).all())
    assert bool((estimate >= 0.5 * bound).all())


def test_each_example_depends_only_on_itself():
    model = digits_model()
    x, y = batch(size=8)
    changed_x, changed_y = x.clone(), y.clone()
    changed_x[3], changed_y[3] = 1 - x[3], (y[3] + 1) % 3
    metrics = {
        "gradient": lambda a, b: input_gradient_norm(model, a, b),
        "hessian": lambda a, b: input_hessian_top_eigenvalue(
            model, a, b, iters=20, tol=0.0, generator=torch.Generator().manual_seed(0)
        ),
        "lipschitz": lambda a, b: local_lipschitz(model, a, generator=torch.Generator().manual_seed(0)),
    }
    keep = torch.arange(8) != 3
    for name, metric in metrics.items():
        original, perturbed = metric(x, y), metric(changed_x, changed_y)
        torch.testing.assert_close(original[keep], perturbed[keep], rtol=1e-5, atol=1e-7, msg=name)
        assert not math.isclose(original[3].item(), perturbed[3].item(), rel_tol=1e-3), name


def test_metrics_leave_the_model_state_alone():
    model = digits_model().train()
    model.normalize.eval()
    marker = [torch.ones_like(p) for p in model.parameters()]
    for p, g in zip(model.parameters(), marker, strict=True):
        p.grad = g
    x, y = batch(size=4)
    input_gradient_norm(model, x, y)
    input_hessian_top_eigenvalue(model, x, y, iters=3)
    local_lipschitz(model, x, steps=2)
    assert model.training and model.net.training and not model.normalize.training
    assert all(p.grad is g and p.requires_grad for p, g in zip(model.parameters(), marker, strict=True))


def test_bad_arguments_are_refused():
    model = digits_model()
    x, y = batch(size=2)
    with pytest.raises(ValueError, match="iters"):
        input_hessian_top_eigenvalue(model, x, y, iters=0)
    with pytest.raises(ValueError, match="eps > 0"):
        local_lipschitz(model, x, eps=0.0)
    with pytest.raises(ValueError, match="direction"):
        local_lipschitz(model, x, direction="sideways")
