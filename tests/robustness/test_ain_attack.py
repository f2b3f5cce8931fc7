"""AINAttack: conditioned on the model's prediction by default; on private training data inside DPAdv and
AdversarialAugmentation under DPCallback; best-of-n draws."""

from __future__ import annotations

import pytest
import torch
from lightning.pytorch.callbacks import Callback

from lightning_dprobust.callbacks import AdversarialAugmentation, DPCallback
from lightning_dprobust.methods import DPSGD, DPAdv
from lightning_dprobust.models import AINGenerator
from lightning_dprobust.robustness.ain_attack import AINAttack, success_rate
from lightning_dprobust.robustness.attacks import build_attack
from tests.helpers import digits, quiet_trainer, recording_labels

EPS = 0.2


def _generator() -> AINGenerator:
    torch.manual_seed(0)
    generator = AINGenerator(10, (1, 8, 8), channels=(4, 4, 4, 4), attention_channels=4, noise_std=0.5)
    generator.bound.fill_(EPS)
    return generator


class Views(Callback):
    """Records the training inputs after every transform (what the private step differentiates)."""

    def __init__(self) -> None:
        self.pairs = []

    def on_train_batch_start(self, trainer, module, batch, batch_idx):
        inputs = batch
        for transform in module.train_input_transforms:
            inputs = transform(module, inputs)
        self.pairs.append((batch[0], inputs[0]))


@pytest.mark.parametrize("where", ["dpadv", "augmentation"])
def test_ain_examples_train_a_classifier_under_dp(where, tmp_path):
    generator = _generator()
    dp = DPCallback(max_grad_norm=1.0, noise_multiplier=1.0, delta=1e-5, seed=3)
    views = Views()
    if where == "dpadv":
        module = DPAdv(attack="AIN", attack_eps=EPS, attack_kwargs={"ain": generator}, model="mlp_tanh")
        callbacks = [dp, views]
    else:
        module = DPSGD(model="mlp_tanh")
        augmentation = AdversarialAugmentation(lambda m: AINAttack(m, generator, EPS), mode="group")
        callbacks = [dp, augmentation, views]
    quiet_trainer(tmp_path, max_steps=2, callbacks=callbacks).fit(module, digits(batch_size=64))
    assert dp.epsilon() > 0 and dp.ledger.steps == 2
    clean, seen = views.pairs[0]
    adversarial = seen if where == "dpadv" else seen[:, 1]
    if where == "augmentation":
        assert torch.equal(seen[:, 0], clean)  # [clean ; AIN] views of each example
    assert (adversarial - clean).abs().max() <= EPS + 1e-6 and not torch.equal(adversarial, clean)


def test_more_draws_fool_at_least_as_many_examples(digits_classifier):
    model, x, y = digits_classifier
    generator = _generator()
    rates = []
    for n_samples in (1, 6):
        adversarial = AINAttack(model, generator, EPS, n_samples=n_samples, seed=0)(x[:128], y[:128])
        assert (adversarial - x[:128]).abs().max() <= EPS + 1e-6
        rates.append(success_rate(model, adversarial, y[:128], None))
    assert rates[1] > rates[0], rates


def test_an_untrained_generator_or_a_bad_budget_is_refused(digits_classifier):
    model = digits_classifier[0]
    untrained = AINGenerator(10, (1, 8, 8), channels=(4, 4, 4, 4))
    with pytest.raises(ValueError, match="below the bound inf"):
        AINAttack(model, untrained, EPS)
    with pytest.raises(ValueError, match="n_samples >= 1"):
        AINAttack(model, _generator(), EPS, n_samples=0)
    with pytest.raises(ValueError, match="needs a trained AIN"):
        build_attack("AIN", model, EPS)


def test_a_generator_of_another_dataset_is_refused_with_one_line():
    """It used to fail deep in the generator (``Sizes of tensors must match ...``)."""
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(28 * 28, 10))
    attack = AINAttack(model, _generator(), EPS)
    with pytest.raises(ValueError, match=r"trained on inputs of shape \(1, 8, 8\) with 10 classes, but the attacked"):
        attack(torch.rand(2, 1, 28, 28), torch.tensor([0, 1]))
    with pytest.raises(ValueError, match=r"--ain x.ckpt was trained .* have \(1, 8, 8\) with 100 classes"):
        attack.check_fits((1, 8, 8), 100, "--ain x.ckpt")
    attack.check_fits((1, 8, 8), 10)


@pytest.mark.parametrize("n_samples", [1, 3])
def test_the_attack_is_conditioned_on_the_prediction_unless_told_to_use_the_true_label(digits_classifier, n_samples):
    model, x, _ = digits_classifier
    x = x[:64]
    predicted = model(x).argmax(dim=1)
    labels = (predicted + 1) % 10  # labels that differ from the prediction everywhere
    generator = _generator()
    seen = recording_labels(generator)
    AINAttack(model, generator, EPS, n_samples=n_samples)(x, labels)
    assert len(seen) == n_samples and all(torch.equal(s, predicted) for s in seen)
    seen.clear()
    AINAttack(model, generator, EPS, n_samples=n_samples, condition="true_label")(x, labels)
    assert len(seen) == n_samples and all(torch.equal(s, labels) for s in seen)
    seen.clear()
    build_attack("AIN", model, EPS, ain=generator)(x, labels)
    assert torch.equal(seen[0], predicted)  # the suite's AIN too
    with pytest.raises(ValueError, match="condition='truth'"):
        AINAttack(model, generator, EPS, condition="truth")
