"""The shared DP wiring of multi-component generative models (methods/generative_base.py)."""

from __future__ import annotations

import math
from types import SimpleNamespace

import lightning as L
import pytest
import torch
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from lightning_dprobust.core.accounting import epsilon_for
from lightning_dprobust.methods.generative_base import GenerativeDPModule, PrivateStepBypassed
from tests.helpers import quiet_trainer

pytestmark = pytest.mark.filterwarnings("ignore:.*reproducibility mode", "ignore:noise_multiplier=0")


class ToyGAN(GenerativeDPModule):
    """A critic that reads real data (private) and a generator trained only through the critic (public)."""

    def __init__(self, private=("critic",), **kwargs):
        super().__init__(**kwargs)
        torch.manual_seed(0)
        self.critic = nn.Linear(4, 1)
        self.generator = nn.Linear(2, 4)
        self._private = frozenset(private)

    def component_modules(self):
        return {"critic": [self.critic], "generator": [self.generator]}

    def private_components(self):
        return self._private

    def learning_rates(self):
        return {"critic": 0.1, "generator": 0.1}

    def critic_loss(self, x, noise):
        return self.critic(self.generator(noise).detach()).squeeze(1) - self.critic(x).squeeze(1)

    def zero_loss(self, x, noise):
        return 0.0 * self.critic(x).squeeze(1)

    def generator_loss(self):
        return -self.critic(self.generator(torch.ones(3, 2))).mean()

    def training_step(self, batch, batch_idx):
        (x,) = batch
        self.component_step("critic", "critic_loss", (x, torch.randn(len(x), 2)))
        self.component_step("generator", self.generator_loss)


def ready(module, rate=0.25, n=64):
    """A module set up as fit would (sample rate, dataset size, a fixed randomness root), outside a Trainer."""
    module.loaders.sample_rate, module.loaders.num_examples = rate, n
    module.randomness.start(SimpleNamespace(world_size=1))
    module.configure_optimizers()
    return module


def flat(module, part):
    return torch.cat([p.detach().flatten() for p in getattr(module, part).parameters()])


def private_update(module, loss, batch):
    params = module.component_parameters()["critic"]
    grads, _ = module._private_gradients("critic", loss, params, batch)
    return torch.cat([g.flatten() for g in grads.values()])


@pytest.mark.parametrize("engine", ["vmap", "ghost"])
def test_private_update_is_clipped_sum_plus_noise_over_expected_batch(engine):
    module = ready(ToyGAN(noise_multiplier=0.0, max_grad_norm=0.5, seed=1, engine=engine))
    x, noise = torch.randn(16, 4) * 10, torch.randn(16, 2)
    total = private_update(module, "critic_loss", (x, noise)) * (0.25 * 64)
    # each example's contribution is at most C: removing one example changes the sum by at most C
    without = private_update(module, "critic_loss", (x[1:], noise[1:])) * (0.25 * 64)
    assert float((total - without).norm()) <= 0.5 + 1e-5
    assert float((total - without).norm()) > 0.4  # its gradient norm is far above C, so it is clipped to C


@pytest.mark.parametrize("engine", ["vmap", "ghost"])
def test_noise_std_is_sigma_times_clip_over_expected_batch_and_only_on_private(engine):
    module = ready(ToyGAN(noise_multiplier=2.0, max_grad_norm=0.5, seed=3, engine=engine))
    module.critic = nn.Linear(4000, 1)
    module._clippers.clear()
    samples = private_update(module, "zero_loss", (torch.zeros(8, 4000), torch.zeros(8, 2)))
    expected = 2.0 * 0.5 / (0.25 * 64)
    assert abs(float(samples.std()) / expected - 1) < 0.05
    public = ready(ToyGAN(noise_multiplier=2.0, seed=3))
    before = flat(public, "generator")
    reference = ToyGAN(noise_multiplier=None)
    reference.configure_optimizers()
    public.component_step("generator", public.generator_loss)
    reference.component_step("generator", reference.generator_loss)
    torch.testing.assert_close(flat(public, "generator"), flat(reference, "generator"), rtol=0, atol=0)
    assert not torch.equal(before, flat(public, "generator"))


def test_sigma_zero_and_huge_clip_equals_the_non_dp_path():
    x, noise = torch.randn(16, 4), torch.randn(16, 2)
    dp = ready(ToyGAN(noise_multiplier=0.0, max_grad_norm=1e12, seed=1))  # expected batch 0.25 * 64 = 16
    plain = ToyGAN(noise_multiplier=None)
    plain.configure_optimizers()
    for module in (dp, plain):
        module.component_step("critic", "critic_loss", (x, noise))
    torch.testing.assert_close(flat(dp, "critic"), flat(plain, "critic"), rtol=1e-6, atol=1e-7)


def test_noise_comes_from_the_secret_root_not_the_global_rng():
    def draw(seed):
        module = ToyGAN(noise_multiplier=1.0, seed=seed)
        ready(module)
        torch.manual_seed(0)
        return private_update(module, "zero_loss", (torch.zeros(4, 4), torch.zeros(4, 2)))

    secret = [draw(None), draw(None)]
    assert not torch.equal(secret[0], secret[1])  # same global seed, different secret roots
    torch.testing.assert_close(draw(5), draw(5))


def test_one_event_per_iteration_at_sigma_over_sqrt_k():
    module = ready(ToyGAN(private=("critic", "generator"), noise_multiplier=1.5, seed=1, accountant="rdp"))
    module._releases = 3
    module.record_iteration()
    module.record_iteration()  # no release: nothing recorded
    (event,) = module.ledger.history
    assert (event.noise_multiplier, event.sample_rate, event.steps) == (1.5 / math.sqrt(3), 0.25, 1)
    module.delta = 1e-5
    assert module.epsilon() == pytest.approx(epsilon_for([(1.5 / math.sqrt(3), 0.25, 1)], 1e-5, "rdp"))
    # three releases on one sample cost more than one
    assert module.epsilon() > epsilon_for([(1.5, 0.25, 1)], 1e-5, "rdp")


def test_batch_clipping_is_only_nominal():
    module = ready(ToyGAN(noise_multiplier=1.0, clip_mode="batch", seed=1, accountant="rdp"))
    module.delta = 1e-5
    module._private_gradients(
        "critic", "critic_loss", module.component_parameters()["critic"], (torch.randn(4, 4), torch.randn(4, 2))
    )
    module.record_iteration()
    assert module.ledger.steps == 0 and module.epsilon() == math.inf
    assert module.nominal_epsilon() == pytest.approx(epsilon_for([(1.0, 0.25, 1)], 1e-5, "rdp"))
    assert "NOT a differential-privacy guarantee" in module.privacy_summary()


def test_components_must_be_disjoint_and_cover_every_parameter():
    module = ToyGAN(noise_multiplier=1.0)
    module.component_modules = lambda: {"critic": [module.critic], "generator": [module.critic, module.generator]}
    with pytest.raises(ValueError, match="belongs to both components"):
        module.component_parameters()
    module.component_modules = lambda: {"critic": [module.critic]}
    with pytest.raises(ValueError, match="belong to no component"):
        module.component_parameters()


def test_a_private_optimizer_step_outside_component_step_is_refused():
    module = ready(ToyGAN(noise_multiplier=1.0, seed=1))
    module.component_step("critic", "critic_loss", (torch.randn(4, 4), torch.randn(4, 2)))  # the private path
    critic_optimizer, generator_optimizer = module._raw_optimizers
    module.critic_loss(torch.randn(4, 4), torch.randn(4, 2)).mean().backward()  # a plain, un-noised gradient
    with pytest.raises(PrivateStepBypassed, match="'critic'"):
        critic_optimizer.step()
    generator_optimizer.step()  # public components are not guarded


def test_a_tensor_in_a_private_optimizer_outside_the_component_is_refused():
    module = ready(ToyGAN(noise_multiplier=1.0, seed=1))
    extra = torch.zeros(3, requires_grad=True)
    module._raw_optimizers[0].add_param_group({"params": [extra]})
    with pytest.raises(PrivateStepBypassed, match="not a trainable parameter of the module"):
        module.component_step("critic", "critic_loss", (torch.randn(4, 4), torch.randn(4, 2)))
    assert torch.equal(extra, torch.zeros(3))


def test_a_buffer_written_during_a_private_iteration_stops_it_and_is_restored():
    module = ready(ToyGAN(noise_multiplier=1.0, seed=1))
    module.critic.register_buffer("seen", torch.zeros(()))
    module.on_train_batch_start(None, 0)
    x = torch.randn(4, 4)
    module.critic.seen.copy_(x.mean())  # a statistic of the private batch, outside any release
    with pytest.raises(PrivateStepBypassed, match="critic.seen"):
        module.component_step("critic", "critic_loss", (x, torch.randn(4, 2)))
    assert float(module.critic.seen) == 0.0


def test_a_private_component_needs_a_per_example_loss():
    module = ready(ToyGAN(noise_multiplier=1.0, seed=1))
    with pytest.raises(TypeError, match="per-example loss method"):
        module.component_step("critic", module.generator_loss)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"noise_multiplier": -1.0}, r"noise_multiplier=-1.0\) must be a finite number >= 0 or None"),
        ({"max_grad_norm": math.inf}, r"max_grad_norm=inf\) must be a finite number > 0"),
        ({"clip_mode": "micro"}, r"clip_mode=.micro.\) must be one of"),
        ({"accountant": "moments"}, r"accountant=.moments.\) must be one of"),
        ({"lr_decay": 0.0}, r"lr_decay=0.0\) must be a finite number > 0"),
    ],
)
def test_bad_arguments_are_refused_in_one_line(kwargs, message):
    with pytest.raises(MisconfigurationException, match=message) as error:
        ToyGAN(**kwargs)
    assert "\n" not in str(error.value)


class Data(L.LightningDataModule):
    def __init__(self, n=64, batch_size=16):
        super().__init__()
        self.set, self.batch_size = TensorDataset(torch.rand(n, 4)), batch_size

    def train_dataloader(self):
        return DataLoader(self.set, batch_size=self.batch_size, shuffle=True)


def test_fit_poisson_samples_accounts_and_checkpoints_the_ledger(tmp_path):
    module = ToyGAN(noise_multiplier=1.0, seed=2)
    trainer = quiet_trainer(tmp_path, max_epochs=2)
    trainer.fit(module, Data())
    assert module.loaders.sample_rate == 0.25 and module.delta == 1e-3
    (event,) = module.ledger.history
    assert (event.noise_multiplier, event.steps) == (1.0, 8)  # 4 Poisson batches per epoch, 2 epochs
    path = tmp_path / "m.ckpt"
    trainer.save_checkpoint(path)
    restored = ToyGAN(noise_multiplier=1.0)
    restored.on_load_checkpoint(torch.load(path, weights_only=True))
    assert restored.ledger.history == module.ledger.history and restored.epsilon() == module.epsilon()


def test_a_bad_delta_is_refused_naming_the_method_not_dpcallback(tmp_path):
    with pytest.raises(MisconfigurationException, match=r"^ToyGAN\(delta=0.5\) is >= 1/n") as error:
        quiet_trainer(tmp_path, max_epochs=1).fit(ToyGAN(noise_multiplier=1.0, delta=0.5), Data())
    assert "DPCallback" not in str(error.value) and "\n" not in str(error.value)
