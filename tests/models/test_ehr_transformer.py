"""The EHR transformer of IGAMT: shapes, ranges, no look-ahead, start steps from the static ranges alone."""

from __future__ import annotations

import pytest
import torch

from lightning_dprobust.models.ehr_transformer import (
    Block,
    DecoderBody,
    EHRDecoder,
    EHREncoder,
    Generator,
    OutputHeads,
    SequenceCritic,
    StepEmbedding,
    cumulative_time,
    generate,
    sample_start,
    static_slots,
)

F, T, D = 6, 7, 16


def ehr_batch(b=3, steps=T, features=F, seed=0):
    generator = torch.Generator().manual_seed(seed)
    m = (torch.rand(b, steps + 1, features, generator=generator) < 0.7).float()
    return torch.rand(b, steps + 1, features, generator=generator) * m, m


def decoder(time=True, static=True):
    torch.manual_seed(0)
    body = DecoderBody(StepEmbedding(F, D, T, 3, time, static), D, 2, 32, 2)
    return EHRDecoder(body, OutputHeads(D, F))


def test_shapes_and_ranges():
    x, m = ehr_batch()
    encoder = EHREncoder(StepEmbedding(F, D, T, 3, True, True), D, 2, 32, 1)
    z = encoder(x, m)
    assert z.shape == (3, D)
    x_hat, m_hat = decoder()(x[:, :-1], m[:, :-1], z)  # teacher forcing: steps 0..T-1 predict 1..T
    assert x_hat.shape == m_hat.shape == (3, T, F)
    start_x, start_m = sample_start(3, F, 1, (2,))
    xs, ms = generate(decoder().body, decoder().last, z, start_x, start_m, T)
    assert xs.shape == ms.shape == (3, T + 1, F)
    assert torch.equal(xs[:, 0], start_x) and torch.equal(ms[:, 0], start_m)
    for tensor in (x_hat.detach(), m_hat.detach(), xs[:, 1:].detach(), ms[:, 1:].detach()):
        assert float(tensor.min()) >= 0 and float(tensor.max()) <= 1


def test_per_step_latent_shapes():
    """IGAMT's ``latent="per_step"``: Enc unpooled, G per position, D_z over time, Dec reading z_k at step k."""
    x, m = ehr_batch()
    encoder = EHREncoder(StepEmbedding(F, D, T, 3, True, True), D, 2, 32, 1, pooled=False)
    z = encoder(x, m)
    assert z.shape == (3, T + 1, D) and float(z.abs().max()) <= 1
    generator = Generator(8, D, 16, per_step=True)
    assert generator.noise_shape(3, T + 1) == (3, T + 1, 8) and Generator(8, D, 16).noise_shape(3, T + 1) == (3, 8)
    z_syn = generator(torch.randn(generator.noise_shape(3, T + 1)))
    assert z_syn.shape == z.shape
    assert SequenceCritic(D, 16)(z).shape == (3,)
    x_hat, m_hat = decoder()(x[:, :-1], m[:, :-1], z)  # z is cut to the T input steps
    assert x_hat.shape == m_hat.shape == (3, T, F)
    start_x, start_m = sample_start(3, F, 1, (2,))
    xs, ms = generate(decoder().body, decoder().last, z_syn, start_x, start_m, T)
    assert xs.shape == ms.shape == (3, T + 1, F)
    with pytest.raises(ValueError, match="per-step latent of 2 steps cannot condition 3"):
        decoder()(x[:, :3], m[:, :3], z[:, :2])


@pytest.mark.parametrize("k", [0, 3, T - 2])
def test_no_look_ahead_with_a_per_step_latent(k):
    """Given z, Dec stays causal in (x, m), and z_{k+1} reaches no position <= k either."""
    net = decoder()
    x, m = ehr_batch()
    z = torch.randn(3, T + 1, D)
    before = net(x, m, z)
    x2, m2, z2 = x.clone(), m.clone(), z.clone()
    x2[:, k + 1] = torch.rand(3, F)
    m2[:, k + 1] = 1 - m2[:, k + 1]
    z2[:, k + 1] = torch.randn(3, D)
    for changed in (net(x2, m2, z), net(x, m, z2)):
        for a, b in zip(before, changed, strict=True):
            torch.testing.assert_close(a[:, : k + 1], b[:, : k + 1], rtol=0, atol=0)
            assert not torch.allclose(a[:, k + 1 :], b[:, k + 1 :])


@pytest.mark.parametrize(("time", "static"), [(True, True), (False, False), (True, False)])
@pytest.mark.parametrize("k", [0, 3, T - 2])
def test_no_look_ahead(time, static, k):
    """Changing input step k + 1 changes no output at positions <= k (which predict steps <= k + 1)."""
    net = decoder(time, static)
    x, m = ehr_batch()
    z = torch.randn(3, D)
    before = net(x, m, z)
    x2, m2 = x.clone(), m.clone()
    x2[:, k + 1] = torch.rand(3, F)
    m2[:, k + 1] = 1 - m2[:, k + 1]
    after = net(x2, m2, z)
    for a, b in zip(before, after, strict=True):
        torch.testing.assert_close(a[:, : k + 1], b[:, : k + 1], rtol=0, atol=0)
        assert not torch.allclose(a[:, k + 1 :], b[:, k + 1 :])  # the change does reach the later positions


def test_a_bidirectional_block_would_look_ahead():
    """The check above can fail: the encoder's non-causal block lets step k + 1 reach position k."""
    torch.manual_seed(0)
    block = Block(D, 2, 32, causal=False)
    h = torch.randn(2, 5, D)
    h2 = h.clone()
    h2[:, 3] = torch.randn(2, D)
    assert not torch.allclose(block(h)[:, :3], block(h2)[:, :3])


def test_cumulative_time_is_the_causal_running_sum_of_observed_increments():
    x = torch.tensor([[[0.9], [0.1], [0.2], [0.3]]])
    m = torch.tensor([[[1.0], [1.0], [0.0], [1.0]]])
    torch.testing.assert_close(cumulative_time(x, m), torch.tensor([[0.0, 0.1, 0.1, 0.4]]))


def test_start_steps_come_from_the_static_ranges():
    x, m = sample_start(500, 9, 2, (2, 3), torch.Generator().manual_seed(0))
    assert torch.equal(m[:, :7], torch.ones(500, 7)) and torch.equal(m[:, 7:], torch.zeros(500, 2))
    assert float(x[:, :2].min()) >= 0 and float(x[:, :2].max()) <= 1
    assert torch.equal(x[:, 2:4].sum(1), torch.ones(500)) and torch.equal(x[:, 4:7].sum(1), torch.ones(500))
    assert set(x[:, 4:7].argmax(1).tolist()) == {0, 1, 2} and torch.equal(x[:, 7:], torch.zeros(500, 2))


@pytest.mark.parametrize(("continuous", "groups", "message"), [(8, (2, 3), "needs 13 slots"), (1, (1,), ">= 2 wide")])
def test_bad_static_layouts_are_refused(continuous, groups, message):
    with pytest.raises(ValueError, match=message):
        static_slots(continuous, groups, 9)


def test_too_long_sequences_are_refused():
    x, m = ehr_batch(steps=T + 1)
    with pytest.raises(ValueError, match="exceed the model's max_steps"):
        decoder()(x, m, torch.randn(3, D))


def test_masks_become_observations_by_bernoulli_draws_or_threshold():
    from lightning_dprobust.models.ehr_release import assemble

    x, m = torch.rand(200, 10, 5), torch.full((200, 10, 5), 0.3)
    xb, mb = assemble(x, m, torch.Generator().manual_seed(0))
    assert abs(float(mb.mean()) - 0.3) < 0.02 and torch.equal(xb, x * mb)
    xt, mt = assemble(x, m, mask="threshold")
    assert float(mt.sum()) == 0 and float(xt.abs().sum()) == 0
    with pytest.raises(ValueError, match="mask must be one of"):
        assemble(x, m, mask="sample")
