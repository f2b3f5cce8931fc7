"""The IGAMT loss formulas (thesis Eqs 4.1-4.6, EDGAMT additions, WGAN-GP) on fixed tensors."""

from __future__ import annotations

import math

import pytest
import torch

from lightning_dprobust.methods import igamt_losses as losses


def test_critic_loss_real_weight_defaults_to_the_number_of_fakes():
    real, fakes = (
        torch.tensor([1.0, -2.0]),
        [torch.tensor([0.5, 1.0]), torch.tensor([2.0, 0.0]), torch.tensor([1.0, 1.0])],
    )
    torch.testing.assert_close(losses.critic_loss(real, fakes), torch.tensor([3.5 - 3.0, 2.0 + 6.0]))  # Eq 4.1
    torch.testing.assert_close(losses.critic_loss(real, fakes, real_weight=1.0), torch.tensor([2.5, 4.0]))  # Alg 1
    torch.testing.assert_close(losses.critic_loss(real, fakes[:1]), torch.tensor([-0.5, 3.0]))  # Eq 4.2


def test_decoder_and_imitation_terms():
    dx = [torch.tensor([1.0]), torch.tensor([2.0])]
    dm = [torch.tensor([0.5]), torch.tensor([0.25])]
    torch.testing.assert_close(losses.decoder_adversarial(dx), torch.tensor([-3.0]))  # Eq 4.3
    torch.testing.assert_close(losses.decoder_adversarial(dx, dm), torch.tensor([-3.75]))  # EDGAMT
    imitated = torch.zeros(1, 2, 2)
    targets = [torch.ones(1, 2, 2), torch.full((1, 2, 2), 2.0)]
    value = losses.imitation(torch.tensor([1.5]), torch.tensor([0.5]), imitated, targets)  # Eq 4.5 + D_m
    torch.testing.assert_close(value, torch.tensor([-2.0 + 1.0 + 4.0]))
    torch.testing.assert_close(losses.imitation(torch.tensor([1.5]), None, imitated, []), torch.tensor([-1.5]))


def test_reconstruction_is_binary_cross_entropy_of_masked_data_and_masks():
    x, m = torch.tensor([[[0.5, 1.0]]]), torch.tensor([[[1.0, 0.0]]])
    x_hat, m_hat = torch.tensor([[[0.25, 0.5]]]), torch.tensor([[[0.5, 0.25]]])
    pred = [0.25 * 0.5, 0.5 * 0.25]
    data = -(0.5 * math.log(pred[0]) + 0.5 * math.log(1 - pred[0]) + math.log(1 - pred[1])) / 2
    mask = -(math.log(0.5) + math.log(0.75)) / 2
    torch.testing.assert_close(losses.reconstruction(x, m, x_hat, m_hat), torch.tensor([data + mask]))


@pytest.mark.parametrize("alpha", [0.0, 0.3, 1.0])
def test_gradient_penalty_of_a_linear_critic(alpha):
    weight = torch.tensor([[3.0, 4.0]])

    def critic(u):
        return (u * weight).sum(dim=(1, 2))

    real, fake = torch.randn(2, 1, 2), torch.randn(2, 1, 2)
    value = losses.gradient_penalty(critic, real, fake, torch.full((2,), alpha))
    torch.testing.assert_close(value, torch.full((2,), (5.0 - 1.0) ** 2))


def test_per_example_losses_read_their_own_example_only():
    x, m = torch.rand(3, 4, 2), (torch.rand(3, 4, 2) > 0.5).float()
    x_hat, m_hat = torch.rand(3, 4, 2), torch.rand(3, 4, 2)
    full = losses.reconstruction(x, m, x_hat, m_hat)
    x[0] = torch.rand(4, 2)
    torch.testing.assert_close(losses.reconstruction(x, m, x_hat, m_hat)[1:], full[1:])
