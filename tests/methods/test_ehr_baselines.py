"""The EHR baselines (VAE, GAN, VAE-GAN, AAE, DAAE): where the noise goes, the non-DP limit, synthesis, a short fit."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
from lightning.pytorch.utilities.exceptions import MisconfigurationException

from lightning_dprobust.data import EHRDataModule
from lightning_dprobust.methods.ehr_baselines import BASELINES
from lightning_dprobust.models.ehr_release import ReleasedSynthesizer
from tests.helpers import quiet_trainer

pytestmark = pytest.mark.filterwarnings("ignore:.*reproducibility mode", "ignore:noise_multiplier=0")

F, T = 6, 5
SMALL = dict(
    num_features=F, static_continuous=1, static_groups=(2,), max_steps=T, d_model=16, heads=2, d_ff=32,
    noise_size=8, critic_hidden=16, synthetic_batch_size=4, critic_freq_base=1,
)  # fmt: skip
NOISED = {
    "vae": {"encoder", "decoder"},
    "gan": {"critics"},
    "vae_gan": {"critics", "encoder", "decoder"},
    "aae": {"critics", "encoder", "decoder"},
    "daae": {"critics", "encoder", "decoder"},
}
"""What each baseline's documentation says is private: every component that reads real data."""


def ehr_batch(b: int = 4, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Tensors of the data contract: step 0 static (1 continuous slot + one-hot of 2), steps 1..T temporal."""
    generator = torch.Generator().manual_seed(seed)
    m = (torch.rand(b, T + 1, F, generator=generator) < 0.7).float()
    x = torch.rand(b, T + 1, F, generator=generator)
    m[:, 0] = torch.tensor([1.0, 1.0, 1.0, 0.0, 0.0, 0.0])
    x[:, 0, 1:] = 0.0
    x[:, 0, 1 + torch.randint(2, (b,), generator=generator)] = 1.0
    return x * m, m


def small(name: str, init_seed: int = 0, **kwargs):
    torch.manual_seed(init_seed)
    return BASELINES[name](**(SMALL | kwargs))


def ready(module, rate: float = 0.25, n: int = 16):
    """Set up as fit would (rate, dataset size, randomness root), outside a Trainer; q * n = 4 = the test batch."""
    module.loaders.sample_rate, module.loaders.num_examples = rate, n
    if module.dp_enabled:
        module.randomness.start(SimpleNamespace(world_size=1))
    module.configure_optimizers()
    return module


def with_sgd(module):
    """Plain SGD, so that parameters after a step compare gradients (Adam's first step is sign-like)."""
    module._raw_optimizers = [torch.optim.SGD(o.param_groups[0]["params"], lr=0.1) for o in module._raw_optimizers]
    return module


def flat(module):
    return torch.cat([p.detach().flatten() for p in module.parameters()])


def spy(module, x, m):
    """One iteration; returns (components stepped, components given noise, components whose loss reads x)."""
    stepped, noised, reads = [], set(), set()
    owner = {name: part for part, params in module.component_parameters().items() for name in params}
    original_step, original_noise = module.component_step, module._noise_generator

    def step(component, loss, batch=()):
        value = getattr(module, loss)(*batch) if isinstance(loss, str) else loss()
        if torch.autograd.grad(value.sum(), x, allow_unused=True, retain_graph=True)[0] is not None:
            reads.add(component)
        stepped.append(component)
        return original_step(component, loss, batch)

    def noise(grads):
        noised.update(owner[name] for name in grads)
        return original_noise(grads)

    module.component_step, module._noise_generator = step, noise
    module.train_iteration(x.requires_grad_(True), m, 0)
    return stepped, noised, reads


@pytest.mark.parametrize("name", sorted(BASELINES))
def test_noise_goes_exactly_on_the_components_that_read_real_data(name):
    module = ready(small(name, noise_multiplier=1.0, seed=1))
    stepped, noised, reads = spy(module, *ehr_batch())
    assert noised == NOISED[name] == module.private_components()
    assert set(stepped) == set(module.component_modules())
    assert reads <= noised  # a component trained without noise never reads the real records
    assert module.nominal_reason() is None
    module.record_iteration()
    (event,) = module.ledger.history  # one event per iteration at sigma / sqrt(K)
    assert event.noise_multiplier == pytest.approx(1.0 / math.sqrt(len(noised)))


@pytest.mark.parametrize("name", sorted(BASELINES))
def test_sigma_zero_and_huge_clip_equal_the_non_dp_path_and_noise_changes_each_private_part(name):
    x, m = ehr_batch()
    dp = with_sgd(ready(small(name, noise_multiplier=0.0, max_grad_norm=1e12, seed=1)))
    plain = with_sgd(ready(small(name, noise_multiplier=None)))
    noisy = with_sgd(ready(small(name, noise_multiplier=1e-14, max_grad_norm=1e12, seed=1)))  # noise std 0.01
    for module in (dp, plain, noisy):
        torch.manual_seed(5)
        module.train_iteration(x, m, 0)
    torch.testing.assert_close(flat(dp), flat(plain), rtol=1e-5, atol=1e-7)
    for component in NOISED[name]:
        params = [(noisy.get_parameter(n), plain.get_parameter(n)) for n in noisy.component_parameters()[component]]
        assert any(not torch.allclose(a, b, rtol=1e-5, atol=1e-7) for a, b in params), component


@pytest.mark.parametrize("name", sorted(BASELINES))
def test_release_synthesizes_alone_with_the_data_shapes(name, tmp_path):
    module = small(name)
    release = module.release()
    assert {key.split(".")[0] for key in release.state_dict()} == {"generator", "body", "last"}
    release.save(tmp_path / "release.pt")
    x, m = ReleasedSynthesizer.load(tmp_path / "release.pt").sample(7, generator=torch.Generator().manual_seed(3))
    x_ref, m_ref = module.synthesize(7, generator=torch.Generator().manual_seed(3))
    torch.testing.assert_close(x, x_ref, rtol=0, atol=0)
    assert x.shape == m.shape == (7, T + 1, F) and torch.equal(m, m_ref)
    assert set(m.unique().tolist()) <= {0.0, 1.0} and torch.equal(x * (1 - m), torch.zeros_like(x))
    assert float(x.min()) >= 0 and float(x.max()) <= 1
    with torch.no_grad():
        module.decoder.last.data.bias.add_(1.0)  # the artifact depends on the decoder it was trained with
    assert not torch.allclose(module.synthesize(7, generator=torch.Generator().manual_seed(3))[0], x)


@pytest.mark.parametrize("name", sorted(BASELINES))
def test_each_baseline_fits_a_few_dp_steps_on_the_ehr_data_and_accounts_them(name, tmp_path):
    data = EHRDataModule(num_records=40, num_steps=T, batch_size=8, val_fraction=0.1, test_fraction=0.1)
    sizes = {key: SMALL[key] for key in ("d_model", "heads", "d_ff", "noise_size", "critic_hidden")}
    torch.manual_seed(0)
    module = BASELINES[name](max_steps=T, noise_multiplier=1.0, seed=4, critic_freq_base=1, **sizes)
    before = flat(module).clone()
    quiet_trainer(tmp_path, max_epochs=1).fit(module, data)
    assert module.iteration == module.ledger.steps == 4  # 32 training records at expected batch size 8
    assert 0 < module.epsilon() < math.inf
    assert torch.isfinite(flat(module)).all() and not torch.equal(before, flat(module))
    assert tuple(module.ehr_schema["feature_names"]) == data.schema.feature_names  # carried for raw-unit output


def test_bad_arguments_and_batches_are_refused_in_one_line():
    with pytest.raises(MisconfigurationException, match="critic_freq_hit <= critic_freq_base") as error:
        small("gan", critic_freq_base=1, critic_freq_hit=2)
    assert "\n" not in str(error.value)
    with pytest.raises(ValueError, match="static layout needs 7 slots"):
        small("vae", static_continuous=5)
    x, m = ehr_batch()
    with pytest.raises(ValueError, match=r"set num_features / max_steps") as error:
        small("aae").training_step((x[..., :4], m[..., :4]), 0)
    assert "\n" not in str(error.value)


def test_a_baseline_checkpoint_synthesizes_through_dprobust_synthesize(tmp_path, capsys):
    from lightning_dprobust.cli.main import main

    data = EHRDataModule(num_records=40, num_steps=T, batch_size=8)
    sizes = {key: SMALL[key] for key in ("d_model", "heads", "d_ff", "noise_size", "critic_hidden")}
    module = BASELINES["daae"](max_steps=T, noise_multiplier=None, **sizes)
    trainer = quiet_trainer(tmp_path, max_steps=2)
    trainer.fit(module, data)
    trainer.save_checkpoint(tmp_path / "daae.ckpt")
    out = tmp_path / "synthetic.csv"
    args = ["synthesize", "--ckpt", str(tmp_path / "daae.ckpt"), "--n", "5", "--out", str(out), "--seed", "1"]
    assert main(args) == 0
    assert "wrote 5 synthetic patients" in capsys.readouterr().out
    header = out.read_text().splitlines()[0].split(",")
    assert header[:4] == ["patient", "time", "feature", "value"] and "gender" in header  # raw units: schema carried
