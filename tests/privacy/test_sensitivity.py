"""The generic sensitivity test (docs/design.md, contract 11) over the catalogue of
:mod:`lightning_dprobust.audit.sensitivity`: a model that mixes examples is refused or runs within ``C``; a model that
does not mix must run (a test that passed by refusing everything would prove nothing)."""

from __future__ import annotations

import pytest
import torch

from lightning_dprobust.audit.sensitivity import (
    BOUND,
    ENGINES,
    MIXING,
    SEPARABLE,
    C,
    build_module,
    neighbours,
    released_distances,
)
from lightning_dprobust.core.engines import build_clipper


@pytest.mark.parametrize("warm_up", [False, True], ids=["adversarial first", "after a warm-up step"])
@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("case", list(MIXING))
def test_a_model_that_mixes_examples_is_refused_or_run_within_the_bound(case, engine, warm_up):
    if case == "loss mixing from step 2" and engine in ("ghost", "auto"):
        pytest.skip("without the probe this waits for the periodic check (tests/core/test_ghost_recheck.py)")
    outcome = released_distances(case, engine, warm_up)
    if isinstance(outcome, list):
        assert max(outcome) <= BOUND, f"{case} under {engine}: one example moved the private sum by {max(outcome)} C"


@pytest.mark.parametrize("warm_up", [False, True], ids=["adversarial first", "after a warm-up step"])
@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("case", list(SEPARABLE))
def test_a_separable_model_runs_within_the_bound(case, engine, warm_up):
    outcome = released_distances(case, engine, warm_up)
    assert isinstance(outcome, list), f"{case} under {engine} was {outcome}"
    assert max(outcome) <= BOUND
    assert max(outcome) > 0.1 * C  # the canary's own clipped gradient is in the sum: the bound is not met by zeros


@pytest.mark.parametrize("case", ["train-only batch standardization", "batch centering", "in-batch attention"])
def test_the_ghost_engine_refuses_a_mixing_model_and_auto_runs_it_on_vmap(case):
    """Not by luck: the ghost engine raises on them, and ``auto`` gives the vmap engine's exact result."""
    assert released_distances(case, "ghost", warm_up=False) == "refused: EngineMismatch"
    module = build_module(case)
    auto, _ = build_clipper("auto", module, "per_example_loss", C)
    vmap, _ = build_clipper("vmap", module, "per_example_loss", C)
    batch = neighbours(0)[0]
    for name, grad in vmap(batch).grads.items():
        torch.testing.assert_close(auto(batch).grads[name], grad)


def test_the_probe_refuses_a_loss_that_starts_to_mix_at_that_step():
    for warm_up in (False, True):
        assert released_distances("loss mixing from step 2", "ghost+probe", warm_up) == "refused: EngineMismatch"


def test_the_catalogue_leaves_the_callers_global_generator_as_it_was():
    """Its fixed seed lives in a fork of torch's generator: a caller's later draws do not become predictable."""
    before = torch.get_rng_state()
    released_distances("batch centering", "vmap", warm_up=False)
    assert torch.equal(torch.get_rng_state(), before)
