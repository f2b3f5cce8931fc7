"""Checkpoints name registered method classes; reading one never imports the module it names."""

from __future__ import annotations

import sys

import pytest
import torch

from lightning_dprobust.cli.loading import load_classifier
from lightning_dprobust.methods import DPSGD, ClassifierModule, register_method
from lightning_dprobust.methods.base import CLASS_KEY
from lightning_dprobust.methods.registry import method_class, qualified_name, registered_methods

KWARGS = {"model": "mlp_tanh", "model_kwargs": {"hidden": 8}, "num_classes": 10, "input_shape": (1, 8, 8)}


class UserMethod(ClassifierModule):
    """A method defined outside the package: loadable only once registered."""


def _checkpoint(tmp_path, cls: type, name: object, file: str = "model.ckpt") -> str:
    module = cls(**KWARGS)
    path = tmp_path / file
    torch.save({CLASS_KEY: name, "hyper_parameters": dict(module.hparams), "state_dict": module.state_dict()}, path)
    return str(path)


def test_project_methods_are_registered_under_the_names_checkpoints_record():
    names = registered_methods()
    for name in ("DPSGD", "DPAdv", "DPCert", "ClassifierModule"):
        assert any(entry.endswith(f":{name}") for entry in names)
    # the format every existing checkpoint and zoo build recorded
    assert method_class("lightning_dprobust.methods.dpsgd:DPSGD") is DPSGD


def test_a_checkpoint_in_the_recorded_format_loads(tmp_path):
    module = load_classifier(_checkpoint(tmp_path, DPSGD, "lightning_dprobust.methods.dpsgd:DPSGD"))
    assert type(module) is DPSGD and not module.training


@pytest.mark.parametrize(
    "name", ["this:DPSGD", "os:system", "xml.dom.minidom:Node", "lightning_dprobust.methods.dpsgd:torch", ["x"]]
)
def test_an_unregistered_class_is_refused_before_any_import(tmp_path, name):
    path = _checkpoint(tmp_path, DPSGD, name)
    load_classifier(
        _checkpoint(tmp_path, DPSGD, qualified_name(DPSGD), "valid.ckpt")
    )  # warm up every lazy import of loading
    before = set(sys.modules)
    with pytest.raises(ValueError, match="not a registered lightning-dprobust method.*register_method"):
        load_classifier(path)
    assert set(sys.modules) == before


def test_a_user_method_loads_only_once_registered(tmp_path):
    path = _checkpoint(tmp_path, UserMethod, qualified_name(UserMethod))
    with pytest.raises(ValueError, match="not a registered"):
        load_classifier(path)
    assert register_method(UserMethod) is UserMethod
    assert type(load_classifier(path)) is UserMethod


def test_register_method_refuses_what_is_not_a_method():
    with pytest.raises(TypeError, match="ClassifierModule subclass"):
        register_method(torch.nn.Linear)
