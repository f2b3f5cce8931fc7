"""AIN's target given as a Lightning ``.ckpt``: rebuilt from the method registry, frozen, and refused with one clear
line when the path is missing, unreadable, not a lightning-dprobust classifier, or an AIN's own checkpoint."""

from __future__ import annotations

import pytest
import torch

from lightning_dprobust.methods import AIN, ClassifierModule
from tests.helpers import digits, quiet_trainer

SMALL = dict(generator_kwargs={"channels": [4, 4, 4, 4], "attention_channels": 4}, ifgsm_steps=2, ifgsm_alpha=0.1)


def _ain(target, **kwargs) -> AIN:
    return AIN(target=target, num_classes=10, input_shape=(1, 8, 8), **SMALL, **kwargs)


@pytest.fixture(scope="module")
def classifier_ckpt(tmp_path_factory):
    folder = tmp_path_factory.mktemp("target")
    torch.manual_seed(0)
    module = ClassifierModule("mlp_tanh", model_kwargs={"hidden": 8}, optimizer="adam", lr=0.01)
    trainer = quiet_trainer(folder, max_epochs=1, limit_train_batches=2)
    trainer.fit(module, digits(batch_size=32))
    trainer.save_checkpoint(folder / "classifier.ckpt")
    return folder / "classifier.ckpt", module.eval()


def test_a_classifier_checkpoint_is_the_frozen_target(classifier_ckpt):
    path, trained = classifier_ckpt
    ain = _ain(str(path))
    x = torch.rand(5, 1, 8, 8)
    with torch.no_grad():
        assert torch.equal(ain.target(x), trained(x))  # the checkpoint's weights, not a fresh initialization
    assert not ain.target.training and not any(p.requires_grad for p in ain.target.parameters())
    assert ain.hparams.target == str(path)  # an AIN checkpoint names its target's file


def test_an_ain_checkpoint_is_refused_as_a_target(classifier_ckpt, tmp_path):
    ain = _ain(str(classifier_ckpt[0]))
    trainer = quiet_trainer(tmp_path, max_epochs=1, limit_train_batches=1)
    trainer.fit(ain, digits(batch_size=16))
    trainer.save_checkpoint(tmp_path / "ain.ckpt")
    with pytest.raises(ValueError, match="is an AIN checkpoint \\(an attack\\), not a classifier") as error:
        _ain(str(tmp_path / "ain.ckpt"))
    assert len(str(error.value).splitlines()) == 1


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "does not exist"),
        (b"not a checkpoint", "truncated, damaged or not a PyTorch checkpoint"),
        ({"state_dict": {}}, "was not written by a lightning-dprobust method"),
    ],
    ids=["missing", "garbage", "foreign"],
)
def test_a_bad_checkpoint_path_is_refused_with_one_line(content, message, tmp_path):
    path = tmp_path / "target.ckpt"
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        torch.save(content, path)
    with pytest.raises(ValueError, match=message) as error:
        _ain(str(path))
    text = str(error.value)
    assert text.startswith(f"AIN(target='{path}')") and len(text.splitlines()) == 1


@pytest.mark.parametrize(
    ("target", "match"),
    [
        ("cnn_tanh.erm_mnist5k", r"AIN\(target='cnn_tanh.erm_mnist5k'\) does not take inputs of shape \(1, 8, 8\)"),
        (torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 3)), r"predicts 3 classes but the data has 10"),
    ],
    ids=["another-input-shape", "another-number-of-classes"],
)
def test_a_target_trained_for_another_dataset_is_refused(target, match):
    with pytest.raises(ValueError, match=match) as error:
        _ain(target)
    assert "\n" not in str(error.value)


def test_a_target_checkpoint_of_another_dataset_is_refused(classifier_ckpt):
    with pytest.raises(ValueError, match=r"classifier.ckpt'\) takes inputs of shape \(1, 8, 8\) but the data has "):
        AIN(target=str(classifier_ckpt[0]), num_classes=10, input_shape=(1, 28, 28), **SMALL)
