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


def test_decoder_and_adversarial_imitation_terms():
    dx = [torch.tensor([1.0]), torch.tensor([2.0])]
    dm = [torch.tensor([0.5]), torch.tensor([0.25])]
    torch.testing.assert_close(losses.decoder_adversarial(dx), torch.tensor([-3.0]))  # Eq 4.3
    torch.testing.assert_close(losses.decoder_adversarial(dx, dm), torch.tensor([-3.75]))  # EDGAMT
    torch.testing.assert_close(
        losses.imitation_adversarial(torch.tensor([1.5]), torch.tensor([0.5])), torch.tensor([-2.0])
    )
    torch.testing.assert_close(losses.imitation_adversarial(torch.tensor([1.5]), None), torch.tensor([-1.5]))


# A 2-record batch of 2 steps x 2 features: values, masks, and a second record pair to compare them with.
X = [[[0.5, 1.0], [0.25, 0.0]], [[0.0, 0.75], [1.0, 0.5]]]
M = [[[1.0, 0.0], [1.0, 1.0]], [[0.0, 1.0], [1.0, 0.0]]]
X_HAT = [[[0.25, 0.5], [0.5, 0.75]], [[0.125, 0.5], [0.625, 0.25]]]
M_HAT = [[[0.5, 0.25], [0.75, 0.5]], [[0.25, 0.875], [0.5, 0.375]]]
CELLS = [(t, f) for t in range(2) for f in range(2)]


def xent(p: float, y: float) -> float:
    return -(y * math.log(p) + (1 - y) * math.log(1 - p))


def per_record(term) -> torch.Tensor:
    """``[sum over cells of term(i, t, f) for i in the 2 records]``."""
    return torch.tensor([sum(term(i, t, f) for t, f in CELLS) for i in range(2)])


def test_reconstruction_authors_form_sums_as_compute_recon_loss_and_compute_mask_loss():
    # (xEnt(x, x^) + xEnt(x m, x^ m^)) / 2 and xEnt(m, m^), summed over steps and features
    unmasked = per_record(lambda i, t, f: xent(X_HAT[i][t][f], X[i][t][f]))
    masked = per_record(lambda i, t, f: xent(X_HAT[i][t][f] * M_HAT[i][t][f], X[i][t][f] * M[i][t][f]))
    mask = per_record(lambda i, t, f: xent(M_HAT[i][t][f], M[i][t][f]))
    data_value, mask_value = losses.reconstruction_terms(*map(torch.tensor, (X, M, X_HAT, M_HAT)), form="authors")
    torch.testing.assert_close(data_value, (unmasked + masked) / 2)
    torch.testing.assert_close(mask_value, mask)


def test_reconstruction_thesis_form_averages_the_masked_data_and_masks():
    masked = per_record(lambda i, t, f: xent(X_HAT[i][t][f] * M_HAT[i][t][f], X[i][t][f] * M[i][t][f])) / 4
    mask = per_record(lambda i, t, f: xent(M_HAT[i][t][f], M[i][t][f])) / 4
    data_value, mask_value = losses.reconstruction_terms(*map(torch.tensor, (X, M, X_HAT, M_HAT)), form="thesis")
    torch.testing.assert_close(data_value, masked)
    torch.testing.assert_close(mask_value, mask)
    torch.testing.assert_close(
        losses.reconstruction(*map(torch.tensor, (X, M, X_HAT, M_HAT))), masked + mask
    )  # baselines


def squared(a, b):
    return lambda i, t, f: (a[i][t][f] - b[i][t][f]) ** 2


def masked_squared(x_a, m_a, x_b, m_b):
    return lambda i, t, f: (x_a[i][t][f] * m_a[i][t][f] - x_b[i][t][f] * m_b[i][t][f]) ** 2


def test_imitation_match_authors_form_sums_data_and_mask_errors_per_target():
    # per target: (SE(x-, x_t) + SE(x- m-, x_t m_t)) / 2 + SE(m-, m_t), summed over cells (the *_match_loss and
    # *_m_match_loss of igamt_utils.py), then over the targets
    imitated = (torch.tensor(X_HAT), torch.tensor(M_HAT))
    targets = [(X, M), (M_HAT, X)]  # any records in [0, 1]
    expected = sum(
        (per_record(squared(X_HAT, x_t)) + per_record(masked_squared(X_HAT, M_HAT, x_t, m_t))) / 2
        + per_record(squared(M_HAT, m_t))
        for x_t, m_t in targets
    )
    value = losses.imitation_match(imitated, [tuple(map(torch.tensor, t)) for t in targets], form="authors")
    torch.testing.assert_close(value, expected)


def test_imitation_match_thesis_form_is_the_mean_squared_error_of_masked_data():
    imitated = (torch.tensor(X_HAT), torch.tensor(M_HAT))
    targets = [(X, M), (M_HAT, X)]
    expected = sum(per_record(masked_squared(X_HAT, M_HAT, x_t, m_t)) / 4 for x_t, m_t in targets)
    value = losses.imitation_match(imitated, [tuple(map(torch.tensor, t)) for t in targets], form="thesis")
    torch.testing.assert_close(value, expected)


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
    for form in losses.LOSS_FORMS:
        full = torch.stack(losses.reconstruction_terms(x, m, x_hat, m_hat, form))
        imitation = losses.imitation_match((x_hat, m_hat), [(x, m)], form)
        changed = x.clone()
        changed[0] = torch.rand(4, 2)
        torch.testing.assert_close(
            torch.stack(losses.reconstruction_terms(changed, m, x_hat, m_hat, form))[:, 1:], full[:, 1:]
        )
        torch.testing.assert_close(losses.imitation_match((x_hat, m_hat), [(changed, m)], form)[1:], imitation[1:])
