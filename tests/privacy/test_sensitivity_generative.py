"""The generic sensitivity test (docs/design.md, contract 11) for the generative mechanisms, IGAMT and each EHR
baseline: every private release a training step makes, replayed on its own batch with an all-ones canary example
appended and without it, moves by at most ``C`` (noise off, so a release is the clipped sum over the expected batch).
Synthetic draws paired with real examples belong to the batch, so the canary carries its own."""

from __future__ import annotations

import pytest
import torch

from lightning_dprobust.audit.sensitivity import distance
from lightning_dprobust.methods.ehr_baselines import BASELINES
from tests.helpers import quiet_trainer
from tests.methods.igamt_helpers import SMALL, EHRData, small

pytestmark = pytest.mark.filterwarnings("ignore:.*reproducibility mode", "ignore:.*noise_multiplier=0")

C = 0.5


def _module(name: str):
    arguments = {"noise_multiplier": 0.0, "max_grad_norm": C, "seed": 1}
    if name.startswith("igamt"):
        return small(**arguments, latent="per_step" if name == "igamt_per_step" else "pooled")
    torch.manual_seed(0)
    return BASELINES[name](**(SMALL | {"critic_freq_base": 1} | arguments))


def _releases(module, tmp_path) -> list[tuple[str, str, tuple[torch.Tensor, ...]]]:
    """``(component, loss, batch)`` of every private release of one training step."""
    captured, release = [], module._private_gradients

    def spy(component, loss, params, batch):
        captured.append((component, loss, tuple(t.detach().clone() for t in batch)))
        return release(component, loss, params, batch)

    module._private_gradients = spy
    quiet_trainer(tmp_path, max_steps=1).fit(module, EHRData())
    module._private_gradients = release
    return captured


@pytest.mark.parametrize("name", ["igamt", "igamt_per_step", *BASELINES])
def test_one_example_moves_every_private_release_by_at_most_C(tmp_path, name):
    module = _module(name)
    releases = _releases(module, tmp_path)
    assert releases, "no private release was made"
    scale = module.loaders.sample_rate * module.loaders.num_examples  # the release is the clipped sum / (q N)
    for component, loss, batch in releases:
        params = module.component_parameters()[component]
        with_canary = tuple(torch.cat([t, torch.ones_like(t[:1])]) for t in batch)
        a, _ = module._private_gradients(component, loss, params, with_canary)
        b, _ = module._private_gradients(component, loss, params, batch)
        moved = distance(a, b) * scale
        assert moved <= C * (1 + 1e-5), f"{name} {component}/{loss}: one example moved the release by {moved}"
        assert moved > 0.0, f"{name} {component}/{loss}: the canary's gradient is absent from the release"
