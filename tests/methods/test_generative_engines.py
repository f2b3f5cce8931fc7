"""The ghost engine on the generative methods' private components: the same clipped sums and norms as vmap.

Every private (component, loss) of an IGAMT iteration (strict DP and the thesis wiring) and of each EHR baseline's
iteration is clipped by both engines on the same batch: odd batch size, an empty batch, parameters outside the
component never returned nor captured.
The critics' loss has a WGAN-GP term (a double backward through the critics): the graph check must hand every critic
parameter to the vmap engine, else the ghost norms would miss the penalty's gradient and this equality would fail.
"""

from __future__ import annotations

import pytest
import torch
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from torch import nn

from lightning_dprobust.core import per_sample
from lightning_dprobust.core.engines import build_clipper
from lightning_dprobust.core.ghost import GhostClipper
from lightning_dprobust.core.per_sample import PerExampleClipper
from lightning_dprobust.methods.ehr_baselines import BASELINES
from tests.core.ghost_checks import without_vmap_checks
from tests.methods.igamt_helpers import ehr_batch, ready, small
from tests.methods.test_ehr_baselines import SMALL as EHR_SMALL


def _igamt(strict_dp: bool) -> nn.Module:
    return ready(small(noise_multiplier=1.0, seed=1, strict_dp=strict_dp, engine="vmap"))


def _baseline(name: str) -> nn.Module:
    torch.manual_seed(0)
    return ready(BASELINES[name](**(EHR_SMALL | dict(noise_multiplier=1.0, seed=1, engine="vmap"))))


MODULES = {"igamt_strict": lambda: _igamt(True), "igamt_thesis": lambda: _igamt(False)}
MODULES |= {f"ehr_{name}": (lambda name=name: _baseline(name)) for name in BASELINES}


def _private_calls(module: nn.Module, monkeypatch) -> list:
    """One iteration with the vmap engine; every private clipper call as (loss, parameter names, batch)."""
    calls, call = [], PerExampleClipper.__call__

    def record(clipper, batch):
        calls.append((clipper._loss_module.method, clipper.parameter_names, batch))
        return call(clipper, batch)

    monkeypatch.setattr(per_sample.PerExampleClipper, "__call__", record)
    x, m = ehr_batch(5)
    torch.manual_seed(0)
    module.train_iteration(x, m, 0)
    monkeypatch.undo()
    return calls


def _assert_same(actual, expected) -> None:
    assert list(actual.grads) == list(expected.grads)
    for name, grad in expected.grads.items():
        scale = float(grad.detach().abs().max()) or 1.0
        torch.testing.assert_close(actual.grads[name], grad, rtol=1e-5, atol=1e-5 * scale)
    torch.testing.assert_close(actual.norms, expected.norms, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("name", list(MODULES))
def test_every_private_loss_gets_the_vmap_engines_clipped_sum(name, monkeypatch):
    module = MODULES[name]()
    calls = _private_calls(module, monkeypatch)
    assert len({names for _, names, _ in calls}) == len(module.private_components())  # every one was clipped
    for loss, names, batch in calls:
        reference = PerExampleClipper(module, loss, module.max_grad_norm, parameter_names=names)
        ghost = GhostClipper(module, loss, module.max_grad_norm, parameter_names=names)
        for rule in ghost.rules:  # only layers owning the component's parameters are captured
            assert set(rule.names.values()) <= names
        expected = reference(batch)
        _assert_same(ghost(batch), expected)
        assert set(expected.grads) == set(names)
        if loss == "critics_loss" and name.startswith("igamt"):  # WGAN-GP: the critics' parameters go to vmap
            assert not ghost.rules and set(ghost.fallback_names) == set(names)
        empty = tuple(t[:0] for t in batch)
        assert all(float(g.abs().sum()) == 0 for g in ghost(empty).grads.values())


def test_a_gradient_penalty_is_never_clipped_with_ghost_norms(monkeypatch):
    """Without the graph check's hand-over, the critics' ghost norms would differ from vmap's."""
    module = _igamt(True)
    loss, names, batch = next(call for call in _private_calls(module, monkeypatch) if call[0] == "critics_loss")
    ghost = GhostClipper(module, loss, module.max_grad_norm, parameter_names=names)
    without_vmap_checks(ghost)
    monkeypatch.setattr("lightning_dprobust.core.ghost.clipper.stray_rules", lambda losses, rules: [])
    wrong = ghost(batch)
    expected = PerExampleClipper(module, loss, module.max_grad_norm, parameter_names=names)(batch)
    assert not torch.allclose(wrong.norms, expected.norms, rtol=1e-3)


def test_the_engine_is_chosen_per_component_and_logged(monkeypatch):
    assert small().engine == "vmap"
    module = ready(small(noise_multiplier=1.0, seed=1, strict_dp=False, engine="auto"))
    messages = []
    monkeypatch.setattr("lightning_dprobust.methods.generative_base.rank_zero_info", messages.append)
    x, m = ehr_batch(5)
    module.train_iteration(x, m, 0)
    assert any("critics / critics_loss: ghost (auto" in text for text in messages)
    assert any("decoder_last / decoder_loss: ghost (auto" in text for text in messages)


def test_an_unknown_engine_is_refused_in_one_line():
    with pytest.raises(MisconfigurationException, match=r"engine=.*\) must be one of"):
        small(engine="fast")


class TwoLayers(nn.Module):
    def __init__(self):
        super().__init__()
        self.first, self.second = nn.Linear(4, 3), nn.Linear(3, 2)

    def per_example_loss(self, x):
        return self.second(torch.tanh(self.first(x))).pow(2).sum(1)


@pytest.mark.parametrize("named", ["first", "second"])
def test_parameter_names_restrict_the_ghost_engine_to_one_layer(named):
    torch.manual_seed(0)
    model = TwoLayers()
    names = {f"{named}.weight", f"{named}.bias"}
    x = torch.randn(5, 4)
    ghost, _ = build_clipper("ghost", model, "per_example_loss", 0.5, parameter_names=names)
    expected = PerExampleClipper(model, "per_example_loss", 0.5, parameter_names=names)((x,))
    _assert_same(ghost((x,)), expected)
    assert [rule.module for rule in ghost.rules] == [getattr(model, named)]
