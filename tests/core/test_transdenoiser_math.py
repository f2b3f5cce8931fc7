"""The mechanisms of TransDenoiser (thesis chapter 6) against their closed forms and finite differences."""

from __future__ import annotations

import math

import pytest
import torch
from torch.func import functional_call, grad

from lightning_dprobust.core import transdenoiser_math
from lightning_dprobust.core.per_sample import clip_factors
from lightning_dprobust.core.transdenoiser_math import (
    gaussian_sigma,
    input_jacobians,
    mgm_equivalent_sigma,
    rank_allows,
    s_min,
    secret_generator,
    taylor_remainders,
    top_up_multiplier,
    transformation_matrix,
)


@pytest.mark.parametrize(("epsilon", "delta", "sensitivity"), [(1.0, 1e-5, 1.0), (0.5, 1e-6, 2.0), (0.1, 1e-3, 0.3)])
def test_gaussian_sigma_is_the_classical_bound(epsilon, delta, sensitivity):
    expected = math.sqrt(2 * math.log(1.25 / delta)) * sensitivity / epsilon
    assert gaussian_sigma(epsilon, delta, sensitivity) == pytest.approx(expected, rel=1e-12)


def test_gaussian_sigma_reference_value_and_refusals():
    assert gaussian_sigma(1.0, 1e-5) == pytest.approx(4.8448, abs=1e-4)
    for bad in ({"epsilon": 1.5, "delta": 1e-5}, {"epsilon": 1.0, "delta": 1.0}, {"epsilon": 0.0, "delta": 1e-5}):
        with pytest.raises(ValueError):
            gaussian_sigma(**bad)


def test_mgm_equivalent_sigma_uses_the_smallest_eigenvalue():
    generator = torch.Generator().manual_seed(0)
    q, _ = torch.linalg.qr(torch.randn(6, 6, generator=generator, dtype=torch.float64))
    eigenvalues = torch.tensor([0.3, 0.7, 1.0, 2.0, 5.0, 9.0], dtype=torch.float64)
    matrix = q @ torch.diag(eigenvalues) @ q.T
    assert mgm_equivalent_sigma(matrix, 1.7) == pytest.approx(math.sqrt(0.3) * 1.7, rel=1e-9)
    assert mgm_equivalent_sigma(torch.eye(4), 1.7) == pytest.approx(1.7)  # the Gaussian mechanism
    stds = torch.tensor([3.0, 0.5, 2.0])  # heterogeneous Gaussian mechanism: sigma_min decides
    assert mgm_equivalent_sigma(torch.diag(stds**2), 1.0) == pytest.approx(0.5)


def test_top_up_rule_bands():
    xi_up, xi_low, sigma, steps = 2.0, 0.5, 0.25, 100
    assert top_up_multiplier(xi_up, xi_low, 0.001, sigma, steps) == xi_up  # sqrt(0.1) * 0.25 < 0.5
    smin = 1.0  # transformed multiplier sqrt(100) * 0.25 = 2.5 >= xi_up
    assert top_up_multiplier(xi_up, xi_low, smin, sigma, steps) == 0.0
    smin = 0.16  # transformed multiplier 1.0, in the middle band
    assert top_up_multiplier(xi_up, xi_low, smin, sigma, steps) == pytest.approx(math.sqrt(4.0 - 1.0))


@pytest.mark.parametrize("smin", [0.0, 1e-6, 1e-3, 0.01, 0.05, 0.1, 0.16, 0.2, 0.5, 3.0])
@pytest.mark.parametrize("steps", [1, 10, 1000])
def test_top_up_reaches_xi_up_whenever_the_transformation_is_used(smin, steps):
    xi_up, xi_low, sigma = 2.0, 0.3, 0.25
    bar = top_up_multiplier(xi_up, xi_low, smin, sigma, steps)
    assert 0.0 <= bar <= xi_up
    if math.sqrt(steps * smin) * sigma >= xi_low:
        assert bar**2 + steps * smin * sigma**2 >= xi_up**2 - 1e-9
    else:
        assert bar == xi_up


def test_clipping_bounds_each_gradient_and_keeps_small_ones():
    norms = torch.tensor([0.0, 0.3, 0.99, 1.0, 1.5, 40.0])
    clipped = norms * clip_factors(norms, 1.0)
    assert bool((clipped <= 1.0 + 1e-6).all())
    torch.testing.assert_close(clipped[:3], norms[:3], rtol=1e-5, atol=1e-6)


def test_taylor_remainder_of_a_convex_quadratic_is_its_exact_second_order_term():
    generator = torch.Generator().manual_seed(1)
    weight = torch.randn(5, 4, generator=generator)

    def loss(inputs, targets):
        return (inputs @ weight.T - targets @ weight.T + 0.3).pow(2).sum(1)

    x = torch.rand(7, 4, generator=generator)
    z = x + 0.25 * torch.randn(7, 4, generator=generator)
    remainders = taylor_remainders(loss, x, z, loss(z, x))
    expected = ((z - x) @ weight.T).pow(2).sum(1)  # l(z) - l(x) - (z - x)^T grad l(x) for a quadratic
    torch.testing.assert_close(remainders, expected, rtol=1e-4, atol=1e-5)
    assert bool((remainders >= 0).all())


def _tiny_mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 3)).double()


def _slice_loss(net, names):
    params = {name: p.detach() for name, p in net.named_parameters()}

    def loss(slice_params, inputs, target):
        return (functional_call(net, {**params, **slice_params}, (inputs[None],)) - target[None]).pow(2).sum()

    return loss, {name: params[name] for name in names}


def test_input_jacobian_matches_finite_differences():
    net = _tiny_mlp()
    loss, params = _slice_loss(net, ["0.weight", "0.bias"])
    x = torch.rand(2, 3, dtype=torch.float64)
    jacobians = input_jacobians(loss, params, x)
    assert jacobians.shape == (2, 16, 3)
    step = 1e-6
    for i in range(2):
        for k in range(3):
            plus, minus = x[i].clone(), x[i].clone()
            plus[k] += step
            minus[k] -= step
            g_plus = torch.cat([g.flatten() for g in grad(loss)(params, plus, x[i]).values()])
            g_minus = torch.cat([g.flatten() for g in grad(loss)(params, minus, x[i]).values()])
            torch.testing.assert_close(jacobians[i, :, k], (g_plus - g_minus) / (2 * step), rtol=1e-3, atol=1e-7)


def test_input_jacobians_do_not_depend_on_how_many_examples_are_differentiated_at_once():
    net = _tiny_mlp()
    loss, params = _slice_loss(net, ["0.weight", "0.bias"])
    x = torch.rand(5, 3, dtype=torch.float64)
    one_at_a_time = input_jacobians(loss, params, x)
    for chunk_size in (2, 5):
        torch.testing.assert_close(input_jacobians(loss, params, x, chunk_size=chunk_size), one_at_a_time)
    for i in range(5):
        torch.testing.assert_close(input_jacobians(loss, params, x[i : i + 1])[0], one_at_a_time[i])


def test_transformation_matrix_is_symmetric_psd_and_s_min_matches_svd():
    net = _tiny_mlp()
    loss, params = _slice_loss(net, ["2.weight", "2.bias"])  # 15 parameters <= 6 examples x 3 inputs
    x = torch.rand(6, 3, dtype=torch.float64)
    factors = torch.rand(6, dtype=torch.float64)
    matrix = transformation_matrix(input_jacobians(loss, params, x), factors, max_grad_norm=0.5)
    torch.testing.assert_close(matrix, matrix.T)
    assert float(torch.linalg.eigvalsh(matrix)[0]) > -1e-10
    assert s_min(matrix) == pytest.approx(float(torch.linalg.svdvals(matrix)[-1]), rel=1e-6, abs=1e-12)


def test_rank_guard_when_the_slice_is_wider_than_the_batch_inputs():
    net = _tiny_mlp()
    loss, params = _slice_loss(net, ["2.weight", "2.bias"])  # 15 parameters > 2 examples x 3 inputs
    x = torch.rand(2, 3, dtype=torch.float64)
    matrix = transformation_matrix(input_jacobians(loss, params, x), torch.ones(2, dtype=torch.float64), 1.0)
    assert not rank_allows(15, 2, 3) and rank_allows(15, 5, 3)
    assert s_min(matrix) <= 1e-10
    assert top_up_multiplier(2.0, 0.0, s_min(matrix), 0.25, 1000) == pytest.approx(2.0, abs=1e-3)


def test_secret_generator_is_not_the_global_stream_and_a_fixed_seed_warns():
    torch.manual_seed(0)
    first = torch.randn(4, generator=secret_generator())
    torch.manual_seed(0)
    second = torch.randn(4, generator=secret_generator())
    assert not torch.equal(first, second)
    with pytest.warns(UserWarning, match="replayable"):
        generators = [secret_generator(5), secret_generator(5)]
    assert torch.equal(*(torch.randn(3, generator=generator) for generator in generators))


@pytest.mark.filterwarnings("ignore:noise seed")
def test_secret_generator_is_keyed_by_the_whole_secret(monkeypatch):
    """Two secrets that differ only above bit 32 give different noise (``manual_seed`` keeps 32 bits on CPU)."""
    low = 0x1234_5678
    assert not torch.equal(
        torch.randn(8, generator=secret_generator(low)), torch.randn(8, generator=secret_generator(low + 2**32))
    )
    secrets_drawn = iter([low + 2**100, low + 2**64])
    monkeypatch.setattr(transdenoiser_math.secrets, "randbits", lambda bits: next(secrets_drawn))
    draws = [torch.randn(8, generator=secret_generator()) for _ in range(2)]
    assert not torch.equal(*draws)
