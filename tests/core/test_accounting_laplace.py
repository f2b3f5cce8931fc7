"""Pure-DP Laplace releases in the privacy ledger: basic composition with the Gaussian history, checkpointing,
separation from nominal claims."""

from __future__ import annotations

import pytest
import torch

from lightning_dprobust.core.accounting import LaplaceEvent, PrivacyLedger, epsilon_for


def test_pure_releases_add_up_and_allow_delta_zero():
    ledger = PrivacyLedger()
    ledger.record_laplace("a", 0.5)
    ledger.record_laplace("b", 1.25)
    assert ledger.epsilon(0.0) == pytest.approx(1.75)
    assert ledger.steps == 0 and ledger.history == ()
    with pytest.raises(ValueError, match="delta"):
        ledger.epsilon(1.5)


def test_pure_releases_compose_with_gaussian_steps_by_basic_composition():
    ledger = PrivacyLedger([(1.1, 0.01, 500)])
    gaussian = epsilon_for([(1.1, 0.01, 500)], 1e-5, "rdp")
    ledger.record_laplace("labels", 0.3)
    assert ledger.epsilon(1e-5, "rdp") == pytest.approx(gaussian + 0.3, rel=1e-12)


def test_recording_one_release_again_changes_nothing_and_a_conflict_is_refused():
    ledger = PrivacyLedger()
    for _ in range(5):  # the same noise draw reused at every step is one release
        ledger.record_laplace("inputs", 0.4)
    assert ledger.epsilon(0.0) == pytest.approx(0.4)
    with pytest.raises(ValueError, match="already recorded"):
        ledger.record_laplace("inputs", 0.5)


def test_laplace_releases_are_checkpointed_and_kept_apart_from_nominal_claims(tmp_path):
    ledger = PrivacyLedger([(1.0, 0.1, 3)])
    ledger.record_laplace("a", 0.5)
    ledger.record_nominal("heuristic", 9.0, 1e-5)
    path = tmp_path / "ledger.pt"
    torch.save(ledger.state_dict(), path)
    restored = PrivacyLedger()
    restored.load_state_dict(torch.load(path, weights_only=True))
    assert restored.laplace == (LaplaceEvent("a", 0.5),)
    assert restored.nominal == ledger.nominal
    # a nominal claim is no guarantee: the ledger holding one reports inf, never a number built from the claim
    assert restored.epsilon(1e-5) == ledger.epsilon(1e-5) == float("inf")
    without_claim = PrivacyLedger([(1.0, 0.1, 3)])
    without_claim.record_laplace("a", 0.5)
    assert without_claim.epsilon(1e-5) == pytest.approx(PrivacyLedger([(1.0, 0.1, 3)]).epsilon(1e-5) + 0.5)
    assert "laplace" not in PrivacyLedger().state_dict()


@pytest.mark.parametrize(("source", "epsilon"), [("", 1.0), ("a", 0.0), ("a", float("inf")), ("a", -1.0)])
def test_invalid_laplace_events_are_refused(source, epsilon):
    with pytest.raises(ValueError, match="source|epsilon"):
        LaplaceEvent(source, epsilon)
