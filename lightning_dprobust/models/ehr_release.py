"""The released artifact of IGAMT (thesis 4.1, 4.7): G, the imitator Dec_i and Dec's last layer, nothing else.

It synthesizes EHRs from Gaussian draws and start steps sampled from the static features' ranges: no training
record, no encoder, no critic. Saved as plain tensors and a plain-data config, read back with
``torch.load(weights_only=True)``, so loading an artifact never executes code.
"""

from __future__ import annotations

import os
from typing import Any

import torch
from torch import Tensor, nn

from lightning_dprobust.models.ehr_transformer import (
    LATENTS,
    DecoderBody,
    Generator,
    OutputHeads,
    StepEmbedding,
    generate,
    sample_start,
    static_slots,
)

FORMAT = "lightning_dprobust.ehr_release/1"
CONFIG_KEYS = (
    "num_features", "static_continuous", "static_groups", "max_steps", "d_model", "heads", "layers", "d_ff",
    "noise_size", "hidden", "time_embedding", "static_embedding",
)  # fmt: skip
OPTIONAL_KEYS = {"latent": "pooled"}  # key: the meaning of its absence (files written before the key existed)


class ReleasedSynthesizer(nn.Module):
    """``generator`` (G), ``body`` (Dec_i, or Dec's body in the ablations without an imitator) and ``last``
    (Dec's last layer), rebuilt from ``config`` (the keys of :data:`CONFIG_KEYS`, and optionally ``latent``:
    ``"pooled"``, what its absence means, or ``"per_step"``, G drawing one latent per step; it is kept in
    :attr:`config` only when it is not ``"pooled"``, so a pooled release is saved as it was before the key existed).

    ``schema``: optional plain-data EHR schema (feature names, scalers, which of them were read from the training
    records, and the privacy unit) for output in raw units.
    """

    def __init__(self, config: dict[str, Any], schema: dict[str, Any] | None = None) -> None:
        super().__init__()
        missing = [key for key in CONFIG_KEYS if key not in config]
        if missing:
            raise ValueError(f"an EHR release config needs {missing}")
        self.config = {key: config[key] for key in CONFIG_KEYS}
        latent = config.get("latent", OPTIONAL_KEYS["latent"])
        if latent not in LATENTS:
            raise ValueError(f"an EHR release config's latent must be one of {LATENTS}, got {latent!r}")
        if latent != OPTIONAL_KEYS["latent"]:
            self.config["latent"] = latent
        c = self.config
        num_static = static_slots(c["static_continuous"], c["static_groups"], c["num_features"])
        embedding = StepEmbedding(
            c["num_features"], c["d_model"], c["max_steps"], num_static, c["time_embedding"], c["static_embedding"]
        )
        self.generator = Generator(c["noise_size"], c["d_model"], c["hidden"], per_step=latent == "per_step")
        self.body = DecoderBody(embedding, c["d_model"], c["heads"], c["d_ff"], c["layers"])
        self.last = OutputHeads(c["d_model"], c["num_features"])
        self.schema = schema
        self.eval()

    @torch.no_grad()
    def sample(
        self, n: int, steps: int | None = None, generator: torch.Generator | None = None, mask: str = "bernoulli"
    ) -> tuple[Tensor, Tensor]:
        """``n`` synthetic records ``(x, m)`` ``[n, 1 + steps, F]``, ``m`` in {0, 1}, ``x`` 0 where missing.

        Draws ``s ~ N(0, I)`` (``[n, noise_size]``, or ``[n, 1 + steps, noise_size]`` per step), then the start
        steps, then the masks (:func:`assemble`), all from ``generator`` (thesis 4.7 steps 1-5).
        """
        c = self.config
        steps = c["max_steps"] if steps is None else steps
        if n < 1 or not 1 <= steps <= c["max_steps"]:
            raise ValueError(f"need n >= 1 and 1 <= steps <= {c['max_steps']}, got n={n}, steps={steps}")
        device = self.last.data.weight.device
        noise = torch.randn(self.generator.noise_shape(n, 1 + steps), generator=generator).to(device)
        start_x, start_m = sample_start(n, c["num_features"], c["static_continuous"], c["static_groups"], generator)
        z = self.generator(noise)
        x, m = generate(self.body, self.last, z, start_x.to(device), start_m.to(device), steps)
        return assemble(x, m, generator, mask)

    def save(self, path: str | os.PathLike) -> None:
        """Write the artifact (plain tensors and data only)."""
        state = {name: tensor.detach().cpu() for name, tensor in self.state_dict().items()}
        torch.save({"format": FORMAT, "config": self.config, "schema": self.schema, "state": state}, path)

    @classmethod
    def load(cls, path: str | os.PathLike) -> ReleasedSynthesizer:
        """Read an artifact written by :meth:`save` (``weights_only=True``)."""
        saved = torch.load(path, map_location="cpu", weights_only=True)
        if not isinstance(saved, dict) or saved.get("format") != FORMAT:
            raise ValueError(f"{path} is not an EHR synthesizer release ({FORMAT})")
        release = cls(saved["config"], saved.get("schema"))
        release.load_state_dict(saved["state"])
        return release


MASK_MODES = ("bernoulli", "threshold")


def assemble(
    x: Tensor, m: Tensor, generator: torch.Generator | None = None, mask: str = "bernoulli"
) -> tuple[Tensor, Tensor]:
    """Thesis 4.7 step 5: mark missing values from the masks; ``x = 0`` where missing.

    ``mask="bernoulli"`` (default) reads the mask head as the probability of an observation and draws each entry
    (from ``generator``, on the CPU), so a feature observed with probability 0.3 is observed about 30 % of the time;
    ``"threshold"`` observes where ``m > 1/2`` (deterministic: it cannot reproduce a missing rate between 0 and 1/2
    for entries the model is unsure about).
    """
    if mask not in MASK_MODES:
        raise ValueError(f"mask must be one of {MASK_MODES}, got {mask!r}")
    if mask == "threshold":
        observed = (m > 0.5).to(x.dtype)
    else:
        observed = (torch.rand(m.shape, generator=generator) < m.detach().cpu()).to(device=x.device, dtype=x.dtype)
    return x * observed, observed
