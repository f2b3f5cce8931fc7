"""The surrogate loss that hands a private step's gradient to Lightning's optimizer loop."""

from __future__ import annotations

import pytest
import torch

from lightning_dprobust.callbacks.dp_guard import gradient_surrogate


def test_the_surrogate_gives_each_parameter_its_gradient_bit_for_bit_in_a_tensor_of_its_own():
    """``.grad`` is the given gradient exactly (the guard compares bit for bit), scaled by the incoming gradient, and a
    tensor of its own: a hook changing ``.grad`` in place cannot change the guard's record with it."""
    torch.manual_seed(0)
    layer = torch.nn.Linear(5, 3)
    params = dict(layer.named_parameters())
    given = {name: torch.randn_like(p) * 1e-3 for name, p in params.items()}
    loss = gradient_surrogate(params, given)
    expected = sum((p * given[name]).sum() for name, p in params.items())
    assert loss.shape == () and torch.equal(loss, expected)
    loss.backward()
    for name, p in params.items():
        assert torch.equal(p.grad, given[name]) and p.grad.data_ptr() != given[name].data_ptr()
    layer.zero_grad()
    (3 * gradient_surrogate(params, {"weight": given["weight"]})).backward()
    assert torch.equal(layer.weight.grad, 3 * given["weight"]) and layer.bias.grad is None
    with pytest.raises(ValueError, match="at least one trainable parameter"):
        gradient_surrogate(params, {})
