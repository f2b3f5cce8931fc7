"""The ghost engine's check against the vmap engine runs again every ``check_every`` calls, so that a per-example
loss that starts to mix examples after the first step is found: the graph check sees which parameters a path reaches,
not which examples' rows it mixes."""

from __future__ import annotations

import pytest
import torch

from lightning_dprobust.core.engines import build_clipper
from lightning_dprobust.core.ghost import CHECK_EVERY, EngineMismatch, GhostClipper
from lightning_dprobust.core.per_sample import PerExampleClipper
from lightning_dprobust.methods import DPSGD
from tests.core.ghost_checks import counting_checks

pytestmark = pytest.mark.usefixtures("double_precision")


class BatchCentered(DPSGD):
    """DP-SGD whose per-example loss gets, once ``mixing`` is set, a term on each example's logits minus the batch's
    mean logits: every example's loss then depends on every other example (a regularizer switched on at some epoch)."""

    mixing = False

    def per_example_loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        losses = super().per_example_loss(x, y)
        if self.mixing:
            logits = self(x)
            losses = losses + (logits - logits.mean(dim=0)).pow(2).sum(dim=1)
        return losses


def _batch(examples: int = 6, seed: int = 3) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return torch.rand(examples, 1, 28, 28, generator=generator), torch.randint(0, 10, (examples,), generator=generator)


@pytest.fixture
def module() -> BatchCentered:
    torch.manual_seed(0)
    return BatchCentered(model="cnn_tanh", num_classes=10, input_shape=(1, 28, 28))


def test_a_loss_that_starts_to_mix_examples_is_refused_at_the_next_check(module):
    ghost = GhostClipper(module, "per_example_loss", 1.0, check_every=3)
    ghost(_batch())  # checked: the loss is separable
    module.mixing = True
    separate = PerExampleClipper(module, "per_example_loss", 1.0)(_batch()).norms  # each example's loss alone
    between = ghost(_batch()).norms  # the calls between two checks are not compared (the documented limit)
    assert not torch.allclose(between, separate, rtol=1e-3)
    ghost(_batch())
    with pytest.raises(EngineMismatch, match="failed after 3 steps whose results were released unchecked"):
        ghost(_batch())


def test_a_late_mismatch_stops_even_where_the_first_check_may_fall_back(module):
    """``auto``'s ``on_mismatch="fallback"`` covers a check before which nothing was released; a later one found the
    released steps unbounded, so it stops by default."""
    ghost = GhostClipper(module, "per_example_loss", 1.0, on_mismatch="fallback", check_every=2)
    ghost(_batch())
    module.mixing = True
    ghost(_batch(seed=4))  # not due: released unchecked
    with pytest.raises(EngineMismatch, match="the run's epsilon no longer holds"):
        ghost(_batch(seed=5))
    assert ghost.unbounded_calls == 0


def test_a_first_check_mismatch_under_fallback_releases_nothing_unbounded(module):
    module.mixing = True
    ghost = GhostClipper(module, "per_example_loss", 1.0, on_mismatch="fallback", check_every=2)
    expected = PerExampleClipper(module, "per_example_loss", 1.0)(_batch())
    torch.testing.assert_close(ghost(_batch()).norms, expected.norms, rtol=1e-10, atol=1e-12)
    assert ghost.unbounded_calls == 0


def test_under_late_fallback_the_unchecked_steps_are_counted_and_the_later_ones_are_the_vmap_engines(module):
    ghost = GhostClipper(module, "per_example_loss", 1.0, check_every=2, on_late_mismatch="fallback")
    ghost(_batch())
    module.mixing = True
    ghost(_batch(seed=4))  # not due: released unchecked
    ghost(_batch(seed=7))  # due: the check fails, this step is the vmap engine's
    # the first call's result (checked before it, but counted from there) and the second's had no bounded sensitivity
    assert ghost.unbounded_calls == 2
    for seed in (5, 6):
        expected = PerExampleClipper(module, "per_example_loss", 1.0)(_batch(seed=seed))
        actual = ghost(_batch(seed=seed))
        torch.testing.assert_close(actual.norms, expected.norms, rtol=1e-10, atol=1e-12)
        for name, grad in expected.grads.items():
            torch.testing.assert_close(actual.grads[name], grad, rtol=1e-10, atol=1e-12)


def test_the_per_step_probe_finds_a_loss_that_starts_to_mix_at_the_step_it_starts(module):
    ghost = GhostClipper(module, "per_example_loss", 1.0, check_every=100, probe=True)
    ghost(_batch())
    ghost(_batch(seed=4))
    module.mixing = True
    with pytest.raises(EngineMismatch, match="the run's epsilon no longer holds"):
        ghost(_batch(seed=5))  # 97 calls before the periodic check is due


def test_the_probe_leaves_a_separable_step_unchecked(module, monkeypatch):
    ghost = GhostClipper(module, "per_example_loss", 1.0, check_every=100, probe=True)
    checks = counting_checks(ghost, monkeypatch)
    for seed in range(5):
        ghost(_batch(seed=seed))
    assert checks == [6]


def test_the_check_runs_every_n_calls_of_two_examples_or_more(module, monkeypatch):
    ghost = GhostClipper(module, "per_example_loss", 1.0, check_every=3)
    checks = counting_checks(ghost, monkeypatch)
    for examples in (1, 4, 5, 6, 7, 1, 1, 2, 3, 8):
        ghost(_batch(examples))
    # the first call of two examples or more (a batch of one is the vmap engine's); then every third such call
    assert checks == [4, 7, 8]


def test_check_every_none_checks_the_first_call_only_and_the_default_is_the_constant(module, monkeypatch):
    assert GhostClipper(module, "per_example_loss", 1.0).check_every == CHECK_EVERY
    ghost = GhostClipper(module, "per_example_loss", 1.0, check_every=None)
    checks = counting_checks(ghost, monkeypatch)
    for _ in range(5):
        ghost(_batch())
    assert checks == [6]


@pytest.mark.parametrize("bad", [0, -1, 2.5, True, "10"])
def test_a_bad_interval_is_refused_by_name(module, bad):
    with pytest.raises(ValueError, match="check_every must be a positive int or None"):
        GhostClipper(module, "per_example_loss", 1.0, check_every=bad)


@pytest.mark.parametrize("engine", ["ghost", "auto"])
def test_the_engines_dpcallback_builds_check_periodically(module, engine):
    clipper, _ = build_clipper(engine, module, "per_example_loss", 1.0)
    assert isinstance(clipper, GhostClipper) and clipper.check_every == CHECK_EVERY


def test_a_mismatch_reports_no_per_example_norm(module, caplog):
    """The norms are computed from private examples before clipping; the error and the log are released, so they
    name the rules that differ but carry no norm value."""
    raising = GhostClipper(module, "per_example_loss", 1.0, check_every=1)
    falling_back = GhostClipper(module, "per_example_loss", 1.0, check_every=1, on_late_mismatch="fallback")
    raising(_batch())
    falling_back(_batch())
    module.mixing = True
    norms = PerExampleClipper(module, "per_example_loss", 1.0)(_batch()).norms[:3].tolist()
    with pytest.raises(EngineMismatch) as error:
        raising(_batch())
    with caplog.at_level("WARNING", logger="lightning_dprobust"):
        falling_back(_batch())
    released = str(error.value) + caplog.text
    assert "model.net.fc2.weight" in released and "using the vmap engine" in caplog.text
    assert not any(f"{norm:.4f}"[:-1] in released for norm in norms)  # not even to three decimals
