"""The AIN LightningModule: frozen target, i-FGSM targets computed once, rollback, checkpointed bound, inference
bound, refusals (thesis chapter 5; spec 9.3 items 6-8)."""

from __future__ import annotations

import pytest
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from torch.utils.data import DataLoader, TensorDataset

from lightning_dprobust.callbacks import DPCallback
from lightning_dprobust.methods import AIN
from lightning_dprobust.robustness.ain_attack import AINAttack, load_ain_generator
from tests.helpers import digits, quiet_trainer, recording_labels

SMALL = dict(generator_kwargs={"channels": [4, 4, 4, 4], "attention_channels": 4}, ifgsm_steps=5, ifgsm_alpha=0.04)


def _loaders(count: int = 48):
    data = digits()
    data.setup("fit")
    x, y = data.train_set.tensors
    train = DataLoader(TensorDataset(x[:count], y[:count]), batch_size=16, shuffle=True)
    val = DataLoader(TensorDataset(x[count : 2 * count], y[count : 2 * count]), batch_size=16)
    return train, val


def _module(**kwargs) -> AIN:
    torch.manual_seed(0)
    return AIN(**(dict(target="mlp_tanh.erm_digits", num_classes=10, input_shape=(1, 8, 8)) | SMALL | kwargs))


def _checksum(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {key: value.clone() for key, value in module.state_dict().items()}


def test_the_target_is_frozen_and_imitation_targets_are_computed_once(tmp_path):
    module = _module()
    before = _checksum(module.target)
    train, val = _loaders()
    counts = []

    class Count(Callback):
        def on_train_epoch_end(self, trainer, pl_module):
            counts.append(pl_module.imitation.computed)

    trainer = quiet_trainer(tmp_path, max_epochs=3, limit_val_batches=None, callbacks=[Count()])
    trainer.fit(module, train, val)
    assert counts == [48, 48, 48]  # every training example attacked in epoch 1, never again
    after = module.target.state_dict()
    assert all(torch.equal(before[key], after[key]) for key in before)
    assert not any(p.requires_grad for p in module.target.parameters()) and not module.target.training
    optimized = {id(p) for group in trainer.optimizers[0].param_groups for p in group["params"]}
    assert optimized == {id(p) for p in module.generator.parameters()}


def test_imitation_targets_are_ifgsm_examples_of_the_frozen_target():
    module = _module(ifgsm_eps=0.1)
    train, _ = _loaders(16)
    x, y = next(iter(train))
    imitated, logits = module.imitation(module.target, x, y)
    assert (imitated - x).abs().max() <= 0.1 + 1e-6 and (imitated - x).abs().max() > 0.05
    assert torch.allclose(logits, module.target(imitated), atol=1e-5)
    hits = (logits.argmax(1) == 8).float().mean()  # targeted at class 8
    assert hits > (module.target(x).argmax(1) == 8).float().mean()


def _scripted(module: AIN, rates: list[float]) -> list[dict]:
    """Replace the validation success by a script; record the generator's weights and bound at each epoch start."""
    script = iter(rates)
    module.validation_success = lambda: next(script)
    records = []

    class Record(Callback):
        def on_train_epoch_start(self, trainer, pl_module):
            records.append({"weights": _checksum(pl_module.generator), "bound": pl_module.bound})

        def on_train_end(self, trainer, pl_module):
            records.append({"weights": _checksum(pl_module.generator), "bound": pl_module.bound})

    return records, Record()


def test_a_rollback_restores_the_previous_weights_keeps_the_bound_and_slows_the_decay(tmp_path):
    module = _module()
    records, recorder = _scripted(module, [1.0, 0.5])
    train, val = _loaders()
    quiet_trainer(tmp_path, max_epochs=2, limit_val_batches=None, callbacks=[recorder]).fit(module, train, val)
    start, second, end = records
    assert second["bound"] == pytest.approx(0.8 * torch.e**-0.03)  # epoch 1 accepted with a speed-up
    assert end["bound"] == second["bound"]  # epoch 2 rolled back: the bound stays
    assert all(torch.equal(end["weights"][k], second["weights"][k]) for k in end["weights"])
    assert not all(torch.equal(start["weights"][k], second["weights"][k]) for k in start["weights"])
    assert module.controller.rate == pytest.approx(-0.015)


def _adam_state(trainer) -> dict:
    """A copy of the optimizer's per-parameter state (``exp_avg``, ``exp_avg_sq``, ``step``)."""
    state = trainer.optimizers[0].state_dict()["state"]
    return {index: {key: value.clone() for key, value in entry.items()} for index, entry in state.items()}


def _same(first: dict, second: dict) -> bool:
    return first.keys() == second.keys() and all(
        first[i].keys() == second[i].keys() and all(torch.equal(first[i][k], second[i][k]) for k in first[i])
        for i in first
    )


def test_a_rollback_restores_the_optimizer_state_of_the_accepted_epoch_and_keeps_the_learning_rate(tmp_path):
    module = _module()
    script = iter([1.0, 0.5, 0.5])  # epoch 1 accepted, epochs 2 and 3 rolled back
    module.validation_success = lambda: next(script)
    states, rates = [], []

    class Record(Callback):
        def on_train_epoch_start(self, trainer, pl_module):
            states.append(_adam_state(trainer))
            rates.append(trainer.optimizers[0].param_groups[0]["lr"])

        def on_train_end(self, trainer, pl_module):
            states.append(_adam_state(trainer))

    train, val = _loaders()
    trainer = quiet_trainer(tmp_path, max_epochs=3, limit_val_batches=None, callbacks=[Record()])
    trainer.fit(module, train, val)
    accepted = states[1]
    assert accepted and all(int(entry["step"]) == 3 for entry in accepted.values())  # 48 examples, batch 16
    assert _same(states[2], accepted) and _same(states[3], accepted)  # the saved state is never updated in place
    first = next(iter(accepted.values()))
    assert set(first) == {"step", "exp_avg", "exp_avg_sq"} and first["exp_avg"].abs().sum() > 0
    assert rates == pytest.approx([1e-3, 1e-3 * 0.99, 1e-3 * 0.99**2])  # the learning rate keeps its schedule
    assert trainer.optimizers[0].param_groups[0]["lr"] == pytest.approx(1e-3 * 0.99**3)


def test_validation_conditions_on_the_targets_prediction_unless_told_to_use_the_true_label():
    x, _ = next(iter(_loaders(16)[1]))
    for condition in ("prediction", "true_label"):
        module = _module(condition=condition)
        seen = recording_labels(module.generator)
        module.log = lambda *args, **kwargs: None
        module._trainer = type("Trainer", (), {"sanity_checking": True})()
        labels = (module.target(x).argmax(dim=1) + 1) % 10
        module._evaluate((x, labels), "test", None)
        expected = module.target(x).argmax(dim=1) if condition == "prediction" else labels
        assert torch.equal(seen[0], expected)
    assert _module().hparams.condition == "prediction"


def test_the_bound_and_the_controller_travel_with_the_checkpoint_and_bound_the_attack(tmp_path):
    module = _module(decay_rate=-0.5)
    module.validation_success = lambda: 1.0
    train, val = _loaders()
    saver = ModelCheckpoint(dirpath=tmp_path, filename="ain", save_last=False)
    quiet_trainer(tmp_path, max_epochs=2, limit_val_batches=None, enable_checkpointing=True, callbacks=[saver]).fit(
        module, train, val
    )
    trained = module.bound
    assert trained < 0.8 * torch.e**-0.5
    generator = load_ain_generator(str(tmp_path / "ain.ckpt"))
    assert float(generator.bound) == pytest.approx(trained) and int(generator.target_class) == 8
    restored = AIN.load_from_checkpoint(tmp_path / "ain.ckpt", weights_only=False)
    assert restored.controller == module.controller
    # inference accepts any bound >= the trained one and refuses a smaller one
    x, y = next(iter(val))
    attack = AINAttack(module.target, generator, eps=trained + 0.1, n_samples=3)
    assert (attack(x, y) - x).abs().max() <= trained + 0.1 + 1e-6
    samples = attack.generate(x, n_samples=4)
    assert samples.shape == (4, *x.shape) and not torch.equal(samples[0], samples[1])
    with pytest.raises(ValueError, match="below the bound"):
        AINAttack(module.target, generator, eps=trained / 2)
    with pytest.raises(ValueError, match="below the trained bound"):
        attack.generate(x, bound=trained / 2)


def test_ain_refuses_a_dp_callback(tmp_path):
    trainer = quiet_trainer(tmp_path, max_epochs=1, callbacks=[DPCallback(noise_multiplier=1.0, max_grad_norm=1.0)])
    with pytest.raises(MisconfigurationException, match="no DP callback"):
        trainer.fit(_module(), digits())


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(target_class=10), "target_class"),
        (dict(initial_bound=1.5), "initial_bound"),
        (dict(decay="exp", decay_rate=0.02), "d < 0"),
        (dict(ifgsm_steps=0), "ifgsm_steps"),
        (dict(condition="label"), "condition"),
        (dict(target="no_such_model.tag"), "neither a zoo entry"),
    ],
)
def test_bad_arguments_are_refused_with_one_line(kwargs, message):
    with pytest.raises(ValueError, match=message) as error:
        _module(**kwargs)
    assert "\n" not in str(error.value)


def test_an_untargeted_ain_counts_misclassifications():
    module = _module(target_class=None)
    logits = torch.tensor([[5.0, 0.0], [0.0, 5.0]])
    success, weight = module.success(logits, torch.tensor([0, 0]))
    assert success.tolist() == [0.0, 1.0] and weight.tolist() == [1.0, 1.0]
    targeted = _module(target_class=1)
    success, weight = targeted.success(logits, torch.tensor([0, 1]))
    assert success.tolist() == [0.0, 1.0] and weight.tolist() == [1.0, 0.0]
