"""The generic sensitivity test (docs/design.md, contracts 11 and 12) for StoBatch's noise releases, on the
catalogue's neighbouring batches (:func:`~lightning_dprobust.audit.sensitivity.neighbours`: ``B - 1`` copies of one
example and an all-ones canary, the canary removed or relabelled).

Each release's noise is calibrated to the sensitivity ``scale * epsilon`` (its Laplace scale times the epsilon
Theorem 4 charges for it). The label release (``chi3`` on ``sum_i h_pi,i y_i``, Lemma 4) moves within its sensitivity
``Delta_L2``. The input release does not (Theorem 4 charges it for an l1 sensitivity of 1; one example moves it by
``C H W`` and more), which is one reason StoBatch's epsilon is nominal: the test checks the module's ledger records
only the nominal claim, no guarantee. That the nominal label reaches the console, W&B, the zoo build record and every
shipped entry is checked by ``tests/methods/test_stobatch_per_example.py``.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from lightning_dprobust.audit.sensitivity import neighbours
from lightning_dprobust.methods import StoBatch
from lightning_dprobust.methods import stobatch as method

TOLERANCE = 1 + 1e-5


def stobatch() -> StoBatch:
    torch.manual_seed(0)
    return StoBatch(num_classes=10, input_shape=(1, 8, 8), attack_steps=1).train()


def label_coefficients(sto: StoBatch, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """``sum_i h_pi,i y_i^T`` (``[|h_pi|, K]``), the coefficients of the label terms that ``chi3`` perturbs."""
    net = sto.net
    h = net.last_hidden(net.features(net.perturb(x)))
    return h.T @ F.one_hot(y, sto.num_classes).to(h.dtype)


@torch.no_grad()
def test_the_label_release_moves_by_at_most_its_calibrated_sensitivity():
    sto = stobatch()
    calibrated = sto.label_scale * sto.epsilon2  # Lap(Delta_L2 / epsilon2) charged epsilon2: Delta_L2 = 2 |h_pi|
    (x0, y0), (x, y) = neighbours(0)
    (x7, y7), _ = neighbours(7)
    with_label_0, with_label_7 = label_coefficients(sto, x0, y0), label_coefficients(sto, x7, y7)
    removed = float((with_label_0 - label_coefficients(sto, x, y)).abs().sum())
    relabelled = float((with_label_0 - with_label_7).abs().sum())
    assert max(removed, relabelled) <= calibrated * TOLERANCE, f"moved by {removed}, {relabelled} > {calibrated}"
    assert min(removed, relabelled) > 0.0  # the canary's own terms are in the release


@torch.no_grad()
def test_the_input_release_exceeds_its_calibrated_sensitivity_and_the_ledger_holds_no_guarantee():
    sto = stobatch()
    calibrated = sto.input_scale * sto.epsilon1 / sto.gamma_x  # Theorem 4's epsilon1 / gamma_x: Delta_x = 1
    (x0, _), (x, _) = neighbours(0)
    moved = float((sto.net.perturb(x0).sum(0) - sto.net.perturb(x).sum(0)).abs().sum())  # the canary's own input
    assert moved >= math.prod(sto.input_shape) > calibrated * TOLERANCE
    assert "sensitivity 1 where one example's l1 range is 2 C H W" in method.NOMINAL_WARNING
    assert math.isinf(sto.ledger.epsilon(0.0)) and sto.ledger.laplace == sto.ledger.history == ()
    assert [claim.source for claim in sto.ledger.nominal] == [method.NOMINAL_SOURCE] and StoBatch.zoo_nominal_privacy
