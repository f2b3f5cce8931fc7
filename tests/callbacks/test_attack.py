"""AdversarialAugmentation: each mode under DPCallback on digits, accounting untouched, model state restored."""

from __future__ import annotations

import doctest
import json

import lightning as L
import pytest
import torch
import torch.nn.functional as F
import torchattacks
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.cli import LightningArgumentParser
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from torchattacks.attack import Attack

from lightning_dprobust.callbacks import AdversarialAugmentation, DPCallback
from lightning_dprobust.callbacks import attack as attack_module
from lightning_dprobust.methods import DPSGD
from lightning_dprobust.robustness.separability import PerExampleAttack, register_separable_attack
from tests.helpers import digits, quiet_trainer

EPS = 0.1


def pgd(model):
    return torchattacks.PGD(model, eps=EPS, alpha=0.05, steps=2)


class ShapeRecording(DPSGD):
    """Records the shape of ``x`` that ``per_example_loss`` sees (one example at a time under DPCallback)."""

    def per_example_loss(self, x, y):
        self.seen_shapes.add(tuple(x.shape))
        return super().per_example_loss(x, y)


class TransformSpy(Callback):
    """Wraps the transform chain: records the batch before and after the others, with modes and gradients."""

    def __init__(self):
        self.records = []

    def setup(self, trainer, pl_module, stage):
        pl_module.train_input_transforms.insert(0, self.before)
        pl_module.train_input_transforms.append(self.after)

    def before(self, module, inputs):
        grads = [p.grad for p in module.parameters()]
        self.records.append(
            {"before": inputs[0].clone(), "grads": grads, "values": [None if g is None else g.clone() for g in grads]}
        )
        return inputs

    def after(self, module, inputs):
        record = self.records[-1]
        record["after"] = inputs[0].clone()
        record["normalize_training"] = module.model.normalize.training
        record["module_training"] = module.training and module.model.net.training
        grads = [p.grad for p in module.parameters()]
        record["grads_kept"] = all(a is b for a, b in zip(grads, record["grads"], strict=True)) and all(
            g is None or torch.equal(g, v) for g, v in zip(grads, record["values"], strict=True)
        )
        record["requires_grad"] = all(p.requires_grad for p in module.parameters())
        return inputs


def fit(tmp_path, augmentation=None):
    torch.manual_seed(0)
    module = ShapeRecording(model="cnn_tanh", num_classes=10, input_shape=(1, 8, 8), lr=0.5)
    module.seen_shapes = set()
    module.model.normalize.eval()
    dp, spy = DPCallback(max_grad_norm=1.0, noise_multiplier=1.0, delta=1e-5, seed=0), TransformSpy()  # same batches
    callbacks = ([augmentation] if augmentation else []) + [spy, dp]
    quiet_trainer(tmp_path, max_steps=3, callbacks=callbacks).fit(module, digits(batch_size=64))
    return module, dp, spy


@pytest.fixture(scope="module")
def baseline(tmp_path_factory):
    return fit(tmp_path_factory.mktemp("baseline"))


@pytest.mark.parametrize("mode", ["replace", "group", "mix"])
def test_each_mode_trains_under_dp_without_touching_the_accounting(tmp_path, baseline, mode):
    module, dp, spy = fit(tmp_path, AdversarialAugmentation(pgd, mode=mode, mix_fraction=0.5))
    _, plain_dp, plain_spy = baseline
    assert dp.loaders.sample_rate == plain_dp.loaders.sample_rate
    assert dp.ledger.history == plain_dp.ledger.history and dp.ledger.steps == 3
    assert [r["before"].shape[0] for r in spy.records] == [r["before"].shape[0] for r in plain_spy.records]
    assert not any(hasattr(p, "grad_sample") for p in module.parameters())
    assert not module.model.normalize.training and module.model.net.training
    assert any(g is not None for record in spy.records for g in record["grads"])  # p.grad of the previous step
    for record in spy.records:
        assert not record["normalize_training"] and record["module_training"]
        assert record["grads_kept"] and record["requires_grad"]
        before, after = record["before"], record["after"]
        assert not after.requires_grad and after.grad_fn is None
        if mode == "group":
            assert after.shape == (before.shape[0], 2, *before.shape[1:])
            assert torch.equal(after[:, 0], before)
            assert (after[:, 1] - before).abs().max() <= EPS + 1e-6
            assert not torch.equal(after[:, 1], before)
        else:
            assert after.shape == before.shape
            assert (after - before).abs().max() <= EPS + 1e-6
    if mode != "group":
        changed = torch.cat([(r["after"] != r["before"]).flatten(1).any(1) for r in spy.records]).float().mean()
        assert (changed == 1.0) if mode == "replace" else (0.35 < changed < 0.65)
    views = {shape[1] for shape in module.seen_shapes}
    assert views == ({2} if mode == "group" else {1})  # [1, 2, C, H, W] per example vs [1, C, H, W]
    assert module.train_input_transforms == [spy.before, spy.after]  # removed at teardown


# ----------------------------------------------------------------------------------------- the transform alone
def make_module():
    torch.manual_seed(0)
    return DPSGD(model="cnn_tanh", num_classes=10, input_shape=(1, 8, 8))


def attached(attack, module, **kwargs):
    callback = AdversarialAugmentation(attack, **kwargs)
    callback.setup(None, module, "fit")
    return callback, module.train_input_transforms[-1]


class LeakyAttack(Attack):
    """A careless attack: back-propagates into the parameters, leaves grad_sample, records the mode it saw."""

    def __init__(self, model):
        super().__init__("LeakyAttack", model)
        self.saw_training = []

    def forward(self, images, labels):
        self.saw_training.append(self.model.training)
        images = images.clone().requires_grad_(True)
        F.cross_entropy(self.get_logits(images), labels).backward()
        for p in self.model.parameters():
            p.grad_sample = torch.zeros(1)
        return (images + 0.01 * images.grad.sign()).clamp(0, 1).detach()


register_separable_attack(LeakyAttack, "one signed gradient step of the batch-mean loss")


@pytest.mark.parametrize("attack_eval_mode", [True, False])
def test_a_careless_attack_leaves_no_trace(attack_eval_mode):
    module = make_module()
    module.model.normalize.eval()
    marker = [torch.full_like(p, 2.0) for p in module.parameters()]
    for p, g in zip(module.parameters(), marker, strict=True):
        p.grad = g
    callback, transform = attached(LeakyAttack, module, attack_eval_mode=attack_eval_mode)
    x, y = torch.rand(5, 1, 8, 8), torch.arange(5)
    out, labels = transform(module, (x, y))
    assert callback.attack.saw_training == [not attack_eval_mode]
    assert module.training and module.model.net.training and not module.model.normalize.training
    assert all(p.grad is g and bool((g == 2.0).all()) for p, g in zip(module.parameters(), marker, strict=True))
    assert all(p.requires_grad and not hasattr(p, "grad_sample") for p in module.parameters())
    assert labels is y and not torch.equal(out, x)


def test_views_group_appends_the_attack_of_view_zero_and_replace_attacks_every_view():
    module = make_module()
    x, y = torch.rand(4, 3, 1, 8, 8), torch.arange(4)
    fgsm = torchattacks.FGSM(module, eps=EPS)
    with torch.enable_grad():
        expected = [fgsm(x[:, v], y) for v in range(3)]
    _, group = attached(lambda m: torchattacks.FGSM(m, eps=EPS), make_module(), mode="group")
    grouped, _ = group(module, (x, y))
    assert grouped.shape == (4, 4, 1, 8, 8)
    torch.testing.assert_close(grouped[:, :3], x)
    torch.testing.assert_close(grouped[:, 3], expected[0])
    _, replace = attached(lambda m: torchattacks.FGSM(m, eps=EPS), make_module(), mode="replace")
    replaced, _ = replace(module, (x, y))
    torch.testing.assert_close(replaced, torch.stack(expected, dim=1))


def test_mix_replaces_the_requested_fraction_and_empty_batches_pass_through():
    module = make_module()
    _, transform = attached(lambda m: torchattacks.FGSM(m, eps=EPS), module, mode="mix", mix_fraction=0.3, seed=1)
    x, y = torch.rand(2000, 1, 8, 8), torch.randint(0, 10, (2000,))
    mixed, _ = transform(module, (x, y))
    changed = (mixed != x).flatten(1).any(1).float().mean().item()
    assert changed == pytest.approx(0.3, abs=0.04)
    empty = (torch.zeros(0, 1, 8, 8), torch.zeros(0, dtype=torch.long))
    assert transform(module, empty) is empty


def test_dict_spec_and_the_cli_parser_build_the_attack_on_the_module():
    module = make_module()
    callback, _ = attached({"class_path": "torchattacks.PGD", "init_args": {"eps": 0.2, "steps": 3}}, module)
    assert isinstance(callback.attack, torchattacks.PGD) and callback.attack.model is module
    assert callback.attack.eps == 0.2
    parser = LightningArgumentParser()  # the parser of `dprobust fit`: callbacks are Trainer arguments
    parser.add_lightning_class_args(L.Trainer, "trainer")
    callbacks = [
        {
            "class_path": "lightning_dprobust.callbacks.AdversarialAugmentation",
            "init_args": {"mode": "group", "attack": {"class_path": "torchattacks.PGD", "init_args": {"eps": 0.05}}},
        }
    ]
    config = parser.parse_args(["--trainer.callbacks", json.dumps(callbacks)])
    (built,) = parser.instantiate_classes(config).trainer.callbacks
    other = make_module()
    built.setup(None, other, "fit")
    assert isinstance(built.attack, torchattacks.PGD) and built.attack.model is other
    assert built.attack.eps == 0.05 and built.mode == "group"
    built.teardown(None, other, "fit")
    assert other.train_input_transforms == []


def test_bad_configurations_are_refused():
    module = make_module()
    with pytest.raises(MisconfigurationException, match="mode"):
        AdversarialAugmentation(pgd, mode="swap")
    with pytest.raises(MisconfigurationException, match="mix_fraction"):
        AdversarialAugmentation(pgd, mode="mix", mix_fraction=1.5)
    with pytest.raises(MisconfigurationException, match="not the LightningModule"):
        attached(pgd(make_module()), module)
    with pytest.raises(MisconfigurationException, match="not a torchattacks"):
        attached({"class_path": "torch.nn.Linear"}, module)
    with pytest.raises(MisconfigurationException, match="not a torchattacks Attack"):
        attached(lambda m: None, module)
    with pytest.raises(MisconfigurationException, match="train_input_transforms"):
        AdversarialAugmentation(pgd).setup(None, torch.nn.Linear(2, 2), "fit")
    callback, transform = attached(pgd(module), module)  # built on the module itself: accepted
    with pytest.raises(ValueError, match="expects images"):
        transform(module, (torch.rand(2, 8, 8), torch.zeros(2, dtype=torch.long)))


@pytest.mark.parametrize(
    "build",
    [
        lambda m: torchattacks.PGD(m, eps=EPS, steps=2),  # draws its random start from the global RNG
        lambda m: PerExampleAttack(torchattacks.APGD(m, eps=EPS, steps=2)),  # reseeds the global RNG at every run
    ],
    ids=["PGD", "PerExample-APGD"],
)
def test_the_attack_leaves_the_global_rng_as_it_found_it_and_draws_from_the_callbacks_stream(build):
    module = make_module()
    x, y = torch.rand(4, 1, 8, 8), torch.arange(4)
    outputs = []
    for global_seed in (1, 2):
        callback, transform = attached(build, module, seed=3)
        torch.manual_seed(global_seed)
        before = torch.get_rng_state()
        outputs.append(transform(module, (x, y))[0])
        assert torch.equal(before, torch.get_rng_state())
    torch.testing.assert_close(outputs[0], outputs[1], rtol=0, atol=0)  # the callback's stream, not the global one
    assert set(callback.state_dict()) == {"generator", "attack_randomness"}


def test_attacks_that_couple_a_batch_are_refused_and_cw_runs_one_example_at_a_time():
    module = make_module()
    with pytest.raises(MisconfigurationException, match="APGD cannot run on private training data.*PerExampleAttack"):
        attached(lambda m: torchattacks.APGD(m, eps=EPS), module)
    callback, _ = attached(lambda m: torchattacks.CW(m, steps=2), make_module())
    assert isinstance(callback.attack, PerExampleAttack)


def test_docstring_example_runs():
    assert doctest.testmod(attack_module, raise_on_error=True).attempted == 2
