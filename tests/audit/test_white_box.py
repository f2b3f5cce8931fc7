"""White-box one-run audit on digits: below the claim for a correct run, far above it for broken mechanisms."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from lightning_dprobust.audit import white_box_audit
from lightning_dprobust.audit.faults import replayed_noise
from lightning_dprobust.audit.white_box import CANARY_GRADIENT_SCALE, canary_scores, with_gradient_canaries
from lightning_dprobust.callbacks import dp as dp_callback
from lightning_dprobust.core.accounting import epsilon_for
from lightning_dprobust.core.engines import build_clipper
from lightning_dprobust.methods import DPSGD
from lightning_dprobust.recipes import load_recipe
from tests.callbacks.conftest import ENGINE_CLASSES

SIGMA, EPOCHS, CANARIES = 2.0, 3, 1000
"""Accounted noise, epochs and gradient canaries of the audited runs: claimed epsilon about 1.6 at delta 1e-5."""


@pytest.fixture(scope="module")
def digits_recipe():
    recipe, datamodule = load_recipe(Path(__file__).resolve().parents[2] / "configs" / "dpsgd" / "digits.yaml")
    dp = {"max_grad_norm": 1.0, "delta": 1e-5, "noise_multiplier": SIGMA}
    return recipe.replace(dp=dp, max_epochs=EPOCHS), datamodule


def _audit(recipe, datamodule, noise_multiplier: float) -> tuple[float, float]:
    """(lower bound, epsilon claimed for the accounted noise SIGMA) of a run that adds ``noise_multiplier``."""
    report = white_box_audit(
        recipe.replace(dp=recipe.dp | {"noise_multiplier": noise_multiplier}), datamodule, CANARIES
    )
    (_, sample_rate, steps), *_ = report.history
    claimed = epsilon_for([(SIGMA, sample_rate, steps)], report.claimed_delta)
    return report.audit.epsilon_lower_bound, claimed


@pytest.mark.parametrize("engine", ["vmap", "ghost"])
def test_a_canary_contributes_exactly_its_clipped_dirac_gradient(engine):
    """Under either engine: canary 3 alone gives ``max_grad_norm`` on coordinate 3 of the tap and zero everywhere
    else; a real example gives zero on the tap."""
    method = with_gradient_canaries(DPSGD, num_canaries=5, max_grad_norm=0.5)
    module = method(model="mlp_tanh", model_kwargs={"hidden": 8}, num_classes=10, input_shape=(1, 8, 8)).train()
    clipper, _ = build_clipper(engine, module, "per_example_loss", 0.5)
    batch = (torch.rand(2, 1, 8, 8), torch.zeros(2, dtype=torch.long), torch.tensor([3, -1]))
    canary_only = clipper((batch[0][:1], batch[1][:1], batch[2][:1]))
    expected = {name: torch.zeros_like(p) for name, p in module.named_parameters()}
    expected["canary_tap.weight"][0, 3] = 0.5
    torch.testing.assert_close(canary_only.grads, expected, atol=1e-6, rtol=0)
    assert canary_only.norms.item() == pytest.approx(CANARY_GRADIENT_SCALE * 0.5)
    real_only = clipper((batch[0][1:], batch[1][1:], batch[2][1:]))
    assert not real_only.grads["canary_tap.weight"].any() and real_only.norms.item() > 0


@pytest.mark.parametrize(("given", "configured", "used"), [("ghost", None, "ghost"), (None, "vmap", "vmap")])
def test_the_audited_run_uses_the_engine_given_else_the_recipes(digits_recipe, monkeypatch, given, configured, used):
    """The engine the audit names (``engine``, else the recipe's ``dp.engine``) is the one the DPCallback builds."""
    built = []

    def recording(engine, *args, **kwargs):
        clipper, choice = build_clipper(engine, *args, **kwargs)
        built.append((engine, type(clipper)))
        return clipper, choice

    monkeypatch.setattr(dp_callback, "build_clipper", recording)
    recipe, datamodule = digits_recipe
    dp = recipe.dp | ({"engine": configured} if configured else {})
    report = white_box_audit(recipe.replace(dp=dp, max_epochs=1), datamodule, 20, engine=given)
    assert report.engine == used and built == [(used, ENGINE_CLASSES[used])]
    assert len(report.scores["sum"]) == 20 and np.isfinite(report.audit.epsilon_lower_bound)


def test_an_unknown_engine_is_refused_by_name(digits_recipe):
    recipe, datamodule = digits_recipe
    with pytest.raises(ValueError, match="engine must be one of .* got 'fast'"):
        white_box_audit(recipe, datamodule, CANARIES, engine="fast")


def test_scores_sum_over_steps_and_cancel_repeated_noise():
    noise = np.random.default_rng(0).normal(size=(1, 2))
    gradients = np.repeat(noise, 4, axis=0) + np.array([[0, 1], [0, 0], [0, 1], [0, 1]])
    scores = canary_scores(gradients)
    np.testing.assert_allclose(scores["sum"], 4 * noise[0] + [0, 3])
    np.testing.assert_allclose(scores["steps"], [0, 2], atol=1e-12)


def test_a_correct_dp_run_stays_below_its_claim(digits_recipe):
    bound, claimed = _audit(*digits_recipe, noise_multiplier=SIGMA)
    assert 1.0 < claimed < 3.0
    assert bound < claimed


def test_ten_times_less_noise_than_accounted_is_caught(digits_recipe):
    bound, claimed = _audit(*digits_recipe, noise_multiplier=SIGMA / 10)
    assert bound > 1.3 * claimed


def test_noise_replayed_every_step_is_caught(digits_recipe):
    with replayed_noise():
        bound, claimed = _audit(*digits_recipe, noise_multiplier=SIGMA)
    assert bound > 1.3 * claimed


def test_the_white_box_audit_refuses_a_run_without_dp(digits_recipe):
    recipe, datamodule = digits_recipe
    with pytest.raises(ValueError, match="DP run"):
        white_box_audit(recipe.replace(dp=None), datamodule, CANARIES)
    with pytest.raises(ValueError, match="trainable coordinates"):
        white_box_audit(recipe.replace(max_epochs=1), datamodule, 10**6)
