"""IGAMT (thesis chapter 4): parameter sharing, where noise goes, strict_dp, critic schedule, release, accounting."""

from __future__ import annotations

import math

import pytest
import torch
from lightning.pytorch.utilities.exceptions import MisconfigurationException

from lightning_dprobust.core.accounting import epsilon_for
from lightning_dprobust.models.ehr_release import ReleasedSynthesizer
from lightning_dprobust.models.ehr_transformer import LatentCritic, OutputHeads, SequenceCritic
from tests.helpers import quiet_trainer
from tests.methods.igamt_helpers import EHRData, ehr_batch, ready, small

pytestmark = pytest.mark.filterwarnings(
    "ignore:.*reproducibility mode", "ignore:noise_multiplier=0", "ignore:.*strict_dp=False", "ignore:.*self.log"
)


def flat(module):
    return torch.cat([p.detach().flatten() for p in module.parameters()])


def test_imitator_shares_the_decoders_last_layer_and_its_optimizer_excludes_it():
    module = small()
    assert not any(isinstance(sub, OutputHeads) for sub in module.imitator.modules())  # no last layer of its own
    owned = module.component_parameters()
    last = {id(p) for p in module.decoder.last.parameters()}
    assert not last & {id(p) for p in owned["imitator"].values()}
    optimizer = module.configure_optimizers()[list(owned).index("imitator")]
    assert not last & {id(p) for group in optimizer.param_groups for p in group["params"]}
    # the imitator's output goes through the very Parameter objects of Dec.last
    s, start_x, start_m = module.draws(2, torch.device("cpu"), 4)
    x_imi, _ = module.synthesize_with(module.imitator, module.generator(s), start_x, start_m, 3)
    grads = torch.autograd.grad(x_imi.sum(), list(module.decoder.last.parameters()), allow_unused=True)
    assert all(g is not None and float(g.abs().sum()) > 0 for g in grads[::2] if g is not None)
    assert grads[0] is not None  # data head weight


def spy_components(module, x):
    """Run one iteration; return (components stepped, those given noise, those whose loss reads the real x)."""
    stepped, noised, reads = [], [], set()
    original_step, original_private = module.component_step, module._private_gradients

    def step(component, loss, batch=()):
        value = getattr(module, loss)(*batch) if isinstance(loss, str) else loss()
        if torch.autograd.grad(value.sum(), x, allow_unused=True, retain_graph=True)[0] is not None:
            reads.add(component)
        stepped.append(component)
        return original_step(component, loss, batch)

    def private(component, *args):
        noised.append(component)
        return original_private(component, *args)

    module.component_step, module._private_gradients = step, private
    x.requires_grad_(True)
    m = (x > 0).float().detach()
    module.train_iteration(x, m, 0)
    return stepped, set(noised), reads


@pytest.mark.parametrize("latent", ["pooled", "per_step"])
def test_strict_dp_noises_every_component_that_reads_real_data(latent):
    module = ready(small(noise_multiplier=1.0, seed=1, latent=latent))
    stepped, noised, reads = spy_components(module, ehr_batch()[0])
    assert stepped == ["critics", "encoder", "decoder", "imitator", "imitator", "generator"]  # authors: 2 Dec_i steps
    assert noised == {"critics", "encoder", "decoder"} == module.private_components()
    assert reads <= noised  # G and Dec_i learn from nothing but noised components and public draws
    assert module.nominal_reason() is None


@pytest.mark.parametrize("latent", ["pooled", "per_step"])
def test_thesis_wiring_noises_critics_and_dec_last_only_and_is_nominal(latent):
    module = ready(small(noise_multiplier=1.0, seed=1, strict_dp=False, latent=latent))
    stepped, noised, reads = spy_components(module, ehr_batch()[0])
    assert stepped == ["critics", "encoder", "decoder_body", "decoder_last", "imitator", "imitator", "generator"]
    assert noised == {"critics", "decoder_last"}
    # the leak of spec 4.6: components that read real data without noise; hence nominal only
    assert reads - noised == {"encoder", "decoder_body", "imitator"}
    module.record_iteration()
    module.delta = 1e-5
    assert module.ledger.steps == 0 and module.epsilon() == math.inf and module.nominal_epsilon() > 0


@pytest.mark.parametrize("latent", ["pooled", "per_step"])
@pytest.mark.parametrize("variant", ["w/o_emb", "only_t_emb", "w/o_imi", "w/o_imi_var"])
def test_ablations(variant, latent):
    module = small(variant=variant, strict_dp=False, latent=latent)
    assert module.imitator is None and "decoder" in module.private_components()
    assert (module.critic_m is not None) == (variant == "w/o_imi_var")
    embedding = module.decoder.body.embedding
    assert (embedding.time is not None) == (variant != "w/o_emb")
    assert (embedding.static is not None) == (variant in ("w/o_imi", "w/o_imi_var"))
    ready(module)
    module.train_iteration(*ehr_batch(), 0)


def with_sgd(module):
    """Plain SGD, so that parameters after a step compare gradients (Adam's first step is sign-like)."""
    module._raw_optimizers = [torch.optim.SGD(o.param_groups[0]["params"], lr=1e-3) for o in module._raw_optimizers]
    return module


@pytest.mark.parametrize(("strict_dp", "latent"), [(True, "pooled"), (False, "pooled"), (True, "per_step")])
def test_sigma_zero_and_huge_clip_equal_the_non_dp_path(strict_dp, latent):
    x, m = ehr_batch()
    options = {"strict_dp": strict_dp, "latent": latent}
    dp = with_sgd(ready(small(noise_multiplier=0.0, max_grad_norm=1e12, seed=1, **options)))
    plain = with_sgd(ready(small(noise_multiplier=None, **options)))
    for module in (dp, plain):
        torch.manual_seed(5)
        module.train_iteration(x, m, 0)
    torch.testing.assert_close(flat(dp), flat(plain), rtol=1e-5, atol=1e-7)
    noisy = with_sgd(ready(small(noise_multiplier=1e-12, max_grad_norm=1e12, seed=1, **options)))
    torch.manual_seed(5)
    noisy.train_iteration(x, m, 0)
    assert not torch.allclose(flat(noisy), flat(plain), rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("strict_dp", [True, False])
def test_an_empty_poisson_batch_still_releases_noise_and_is_accounted(strict_dp):
    module = ready(small(noise_multiplier=1.0, seed=1, strict_dp=strict_dp))
    before = {name: flat(part) for name, part in (("critics", module.critic_x), ("last", module.decoder.last))}
    x, m = ehr_batch()
    module.train_iteration(x[:0], m[:0], 0)
    module.record_iteration()
    assert module.ledger.steps + module._nominal_ledger.steps == 1
    for name, part in (("critics", module.critic_x), ("last", module.decoder.last)):
        assert torch.isfinite(flat(part)).all() and not torch.equal(before[name], flat(part))


def test_critic_schedule():
    module = ready(small(critic_freq_base=3, critic_freq_hit=2, noise_multiplier=None))
    assert [module.critics_scheduled(t) for t in range(7)] == [t % 3 < 2 for t in range(7)]
    calls = []
    module.component_step = lambda name, *args: calls.append(name) or torch.tensor(0.0)
    for t in range(6):
        module.train_iteration(*ehr_batch(), t)
    assert calls.count("critics") == 4 and calls.count("generator") == 6


def test_loss_composition_on_fixed_tensors():
    module = small(gp_weight=0.0, recon_weight=2.0, real_weight=None, loss_form="thesis")
    x, m = ehr_batch()
    fakes = [ehr_batch(seed=s) for s in (2, 3, 4)]
    z, z_syn = torch.randn(4, 16), torch.randn(4, 16)
    args = (x, m, *fakes[0], z, z_syn, *fakes[1], *fakes[2], torch.rand(4))
    dx, dz, dm = module.critic_x, module.critic_z, module.critic_m
    expected = sum(dx(a * b) for a, b in fakes) - 3 * dx(x * m) + dz(z_syn) - dz(z)
    expected = expected + sum(dm(b) for _, b in fakes) - 3 * dm(m)
    torch.testing.assert_close(module.critics_loss(*args), expected)
    z_real = module.encoder(x, m)
    x_hat, m_hat = module.decoder(x[:, :-1], m[:, :-1], z_real)
    bce = torch.nn.functional.binary_cross_entropy
    recon = torch.stack([bce(x_hat[i] * m_hat[i], x[i, 1:] * m[i, 1:]) + bce(m_hat[i], m[i, 1:]) for i in range(4)])
    torch.testing.assert_close(module.encoder_loss(x, m), 2.0 * recon + dz(z_real))
    module.hparams.loss_form, module.hparams.mask_weight = "authors", 0.5  # beta_recon (l_1 + l_2) / 2 + beta_mask l_m
    data = torch.stack([bce(x_hat[i], x[i, 1:]) + bce(x_hat[i] * m_hat[i], x[i, 1:] * m[i, 1:]) for i in range(4)])
    mask = torch.stack([bce(m_hat[i], m[i, 1:], reduction="sum") for i in range(4)])
    cells = x_hat[0].numel()  # the authors' code sums over steps and features
    torch.testing.assert_close(module.encoder_loss(x, m), 2.0 * cells * data / 2 + 0.5 * mask + dz(z_real))


def test_released_artifact_is_g_imitator_and_last_layer_and_synthesizes_alone(tmp_path):
    module = small()
    release = module.release()
    assert {name.split(".")[0] for name in release.state_dict()} == {"generator", "body", "last"}
    torch.testing.assert_close(flat(release.body), flat(module.imitator), rtol=0, atol=0)
    torch.testing.assert_close(flat(release.last), flat(module.decoder.last), rtol=0, atol=0)
    torch.testing.assert_close(flat(release.generator), flat(module.generator), rtol=0, atol=0)
    release.save(tmp_path / "release.pt")
    with torch.no_grad():  # training goes on: the saved artifact does not change
        for p in module.encoder.parameters():
            p.add_(1.0)
    loaded = ReleasedSynthesizer.load(tmp_path / "release.pt")
    x, m = loaded.sample(6, generator=torch.Generator().manual_seed(3))
    x_ref, m_ref = module.synthesize(6, generator=torch.Generator().manual_seed(3))
    torch.testing.assert_close(x, x_ref, rtol=0, atol=0)
    assert torch.equal(m, m_ref) and x.shape == (6, 6, 6)
    assert torch.equal(x * (1 - m), torch.zeros_like(x))  # missing values are 0
    with torch.no_grad():
        module.decoder.last.data.weight.add_(torch.randn_like(module.decoder.last.data.weight))  # uses Dec.last
    assert not torch.allclose(module.synthesize(6, generator=torch.Generator().manual_seed(3))[0], x)


def test_per_step_latent_components_and_release_round_trip(tmp_path):
    """``latent="per_step"``: z and G's draws are [B, 1 + T, d], D_z is a sequence critic; the release keeps the
    latent in its config (a pooled one does not), saves, loads and samples what the module synthesizes."""
    module = small(latent="per_step")
    x, m = ehr_batch()
    z = module.encoder(x, m)
    s, _, _ = module.draws(4, torch.device("cpu"), x.shape[1])
    assert z.shape == module.generator(s).shape == (4, x.shape[1], 16) and module.critic_z(z).shape == (4,)
    assert isinstance(module.critic_z, SequenceCritic) and isinstance(small().critic_z, LatentCritic)
    assert "latent" not in small().release().config
    release = module.release()
    assert release.config["latent"] == "per_step" and release.generator.per_step
    release.save(tmp_path / "release.pt")
    loaded = ReleasedSynthesizer.load(tmp_path / "release.pt")
    for steps in (None, 2):
        x_syn, m_syn = loaded.sample(5, steps, generator=torch.Generator().manual_seed(3))
        x_ref, m_ref = module.synthesize(5, steps, generator=torch.Generator().manual_seed(3))
        torch.testing.assert_close(x_syn, x_ref, rtol=0, atol=0)
        assert torch.equal(m_syn, m_ref) and x_syn.shape == (5, 1 + (steps or 5), 6)


def test_a_per_step_fit_is_accounted(tmp_path):
    module = small(noise_multiplier=1.0, seed=4, critic_freq_base=2, accountant="rdp", latent="per_step")
    quiet_trainer(tmp_path, max_epochs=1).fit(module, EHRData(n=16, batch_size=4))
    assert module.iteration == 4 and module.ledger.steps == 4
    module.delta = 1e-5
    assert 0 < module.epsilon() < math.inf and module.nominal_reason() is None


def test_fit_accounts_every_iteration_at_sigma_over_sqrt_k(tmp_path):
    module = small(noise_multiplier=1.0, seed=4, critic_freq_base=2, critic_freq_hit=1, accountant="rdp")
    trainer = quiet_trainer(tmp_path, max_epochs=1)
    trainer.fit(module, EHRData(n=16, batch_size=4))
    assert module.iteration == 4 and module.loaders.sample_rate == 0.25
    history = [(e.noise_multiplier, e.sample_rate, e.steps) for e in module.ledger.history]
    expected = [(1 / math.sqrt(3), 0.25, 1), (1 / math.sqrt(2), 0.25, 1)] * 2  # critics every other iteration
    assert history == expected
    module.delta = 1e-5
    opacus = pytest.importorskip("opacus.accountants")
    reference = opacus.RDPAccountant()
    for sigma, rate, _ in expected:
        reference.step(noise_multiplier=sigma, sample_rate=rate)
    assert module.epsilon(1e-5) == pytest.approx(reference.get_epsilon(1e-5), rel=1e-3)
    assert module.epsilon(1e-5) == pytest.approx(epsilon_for(expected, 1e-5, "rdp"))
    assert f"epsilon {module.epsilon():.4g} at delta 1e-05 (rdp), 4 steps" in module.privacy_summary()


@pytest.mark.parametrize(("loss_form", "imitator_steps"), [("authors", 2), ("thesis", 1)])
def test_the_imitator_takes_its_loss_forms_steps_and_the_ledger_counts_every_release(
    tmp_path, loss_form, imitator_steps
):
    """The authors' code steps Dec_i twice per iteration (``igamt_utils.py``, "step 6: Update Imi"); under strict_dp
    Dec_i reads no real data, so neither step is a release: the ledger composes the critics', Enc's and Dec's."""
    module = small(noise_multiplier=1.0, seed=4, critic_freq_base=2, accountant="rdp", loss_form=loss_form)
    steps = []
    configure = module.configure_optimizers

    def counting_optimizers():
        optimizers = configure()
        imitator = optimizers[list(module.component_modules()).index("imitator")]
        imitator.register_step_post_hook(lambda *_: steps.append(module.iteration))
        return optimizers

    module.configure_optimizers = counting_optimizers
    quiet_trainer(tmp_path, max_epochs=1).fit(module, EHRData(n=16, batch_size=4))
    assert module.iteration == 4 and sorted(steps) == [i for i in range(4) for _ in range(imitator_steps)]
    expected = [(1 / math.sqrt(3), 0.25, 1), (1 / math.sqrt(2), 0.25, 1)] * 2  # K = 3 with the critics, else 2
    assert [(e.noise_multiplier, e.sample_rate, e.steps) for e in module.ledger.history] == expected
    assert module.epsilon(1e-5) == pytest.approx(epsilon_for(expected, 1e-5, "rdp"))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"variant": "igamt_plus"}, "variant must be one of"),
        ({"loss_form": "paper"}, "loss_form must be one of"),
        ({"latent": "memory"}, "latent must be one of"),
        ({"critic_freq_base": 1, "critic_freq_hit": 2}, "critic_freq_hit <= critic_freq_base"),
        ({"static_continuous": 5}, "static layout needs 7 slots"),
        ({"clip_mode": "micro"}, r"clip_mode=.micro.\) must be one of"),
    ],
)
def test_bad_arguments_are_refused_in_one_line(kwargs, message):
    with pytest.raises((MisconfigurationException, ValueError), match=message) as error:
        small(**kwargs)
    assert "\n" not in str(error.value)


def test_bad_batches_are_refused_in_one_line():
    module = small()
    x, m = ehr_batch()
    for batch in ((x[:, :, :4], m[:, :, :4]), (x,), (x, m[:, :3])):
        with pytest.raises(ValueError, match="IGAMT") as error:
            module.training_step(batch, 0)
        assert "\n" not in str(error.value)


def test_a_resumed_fit_reports_the_epsilon_of_an_unbroken_one(tmp_path):
    unbroken = small(noise_multiplier=1.0, seed=4, critic_freq_base=2)
    quiet_trainer(tmp_path / "a", max_epochs=2).fit(unbroken, EHRData(n=16, batch_size=8))
    first = small(noise_multiplier=1.0, seed=4, critic_freq_base=2)
    trainer = quiet_trainer(tmp_path / "b", max_epochs=1)
    trainer.fit(first, EHRData(n=16, batch_size=8))
    trainer.save_checkpoint(tmp_path / "one.ckpt")
    resumed = small(noise_multiplier=1.0, seed=4, critic_freq_base=2)
    quiet_trainer(tmp_path / "c", max_epochs=2).fit(
        resumed, EHRData(n=16, batch_size=8), ckpt_path=tmp_path / "one.ckpt"
    )
    assert resumed.iteration == unbroken.iteration == 4
    assert resumed.ledger.history == unbroken.ledger.history and resumed.epsilon() == unbroken.epsilon()
