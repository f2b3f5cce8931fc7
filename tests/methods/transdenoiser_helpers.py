"""A small TransDenoiser (a tiny DnCNN in front of a linear public classifier) and its callback after one step."""

from __future__ import annotations

import torch

from lightning_dprobust.callbacks import TransDenoiserCallback
from lightning_dprobust.methods import TransDenoiser
from tests.helpers import digits, quiet_trainer

TINY = {"width": 16, "depth": 3, "groups": 4}


def public_classifier() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 10))


def denoiser(**kwargs) -> TransDenoiser:
    torch.manual_seed(0)
    defaults = {"classifier": public_classifier(), "input_shape": (1, 8, 8), "denoiser_kwargs": TINY, "seed": 3}
    return TransDenoiser(**(defaults | kwargs))


def ready_callback(tmp_path, **kwargs) -> tuple[TransDenoiserCallback, TransDenoiser]:
    """A seeded ``TransDenoiserCallback`` (``kwargs``) and its denoiser after one training step on digits: set up
    (sampling, clipper, slices, randomness) so that its ``private_step`` can be called on any batch."""
    module = denoiser()
    dp = TransDenoiserCallback(delta=1e-5, seed=4, **kwargs)
    quiet_trainer(tmp_path, callbacks=[dp], max_steps=1).fit(module, digits(batch_size=64))
    return dp, module
