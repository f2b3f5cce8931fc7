"""The generic sensitivity test (docs/design.md, contract 11) for TransDenoiser: its own loss
(``||g(z_i) - x_i||^2`` on the per-example noisy inputs ``z_i``) through ``TransDenoiserCallback.private_step`` in
both modes, on the catalogue's neighbouring batches (:func:`~lightning_dprobust.audit.sensitivity.canary_pairs`). The
clipped sum that the step releases (the input of the noise, captured at the release) moves by at most ``C`` on every
parameter slice and on the whole denoiser. The denoiser reads no label, so the relabelled canary is a second draw of
the input noise."""

from __future__ import annotations

import pytest
import torch

from lightning_dprobust.audit.sensitivity import BOUND, C, canary_pairs, distance
from lightning_dprobust.callbacks import transdenoiser
from tests.methods.transdenoiser_helpers import ready_callback

pytestmark = [
    pytest.mark.filterwarnings("ignore:noise seed"),
    pytest.mark.filterwarnings("ignore:.*reproducibility mode"),
]


def released_sum(dp, inputs, monkeypatch) -> dict[str, torch.Tensor]:
    """The clipped sum ``dp.private_step(inputs)`` hands to the release, before its noise (the release is in place)."""
    captured = {}
    release = transdenoiser.release_slices_

    def spy(clipped_sum, *args):
        captured.update({name: g.detach().clone() for name, g in clipped_sum.items()})
        return release(clipped_sum, *args)

    monkeypatch.setattr(transdenoiser, "release_slices_", spy)
    dp.private_step(inputs)
    monkeypatch.setattr(transdenoiser, "release_slices_", release)
    return captured


@pytest.mark.parametrize("mode", ["transdenoiser", "sepdp"])
def test_one_example_moves_each_slice_of_the_released_sum_by_at_most_C(tmp_path, monkeypatch, mode):
    dp, module = ready_callback(tmp_path, mode=mode, max_grad_norm=C)
    slices = module.parameter_slices()
    for inputs, without in canary_pairs(module):
        a, b = released_sum(dp, inputs, monkeypatch), released_sum(dp, without, monkeypatch)
        moved = {key: distance(a, b, names) for key, names in slices.items()}
        total = distance(a, b)
        assert max(moved.values()) <= BOUND and total <= BOUND, f"{mode}: one example moved the sum by {moved}, {total}"
        assert total > 0.1 * C  # the canary's own clipped gradient is in the sum: the bound is not met by zeros
