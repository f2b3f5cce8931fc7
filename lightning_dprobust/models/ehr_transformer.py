"""The seq2seq transformer autoencoder of IGAMT (Tang 2021, PhD thesis, Emory University, chapter 4 and App. .1).

Data contract (``data/ehr.py``): ``x, m`` of shape ``[B, 1 + T, F]`` in ``[0, 1]``; step 0 holds the static (start)
features padded to ``F`` (``static_continuous`` slots, then one one-hot group per entry of ``static_groups``),
steps ``1..T`` are temporal, feature 0 of a temporal step is the scaled time increment; ``m`` is 1 where observed.

Components (all free of cross-example layers, so per-example gradients are exact):

* :class:`StepEmbedding`: ``Linear(2F -> d)`` of ``(x m, m)`` plus a learned position embedding, plus optionally a
  **time embedding** (sinusoids of the cumulative time, i.e. the running sum of the increments, through a linear
  layer) and a **static-feature embedding** (a linear map of step 0's static slots, broadcast to every step); both
  are added to the hidden states (thesis Fig 4.3).
* :class:`EHREncoder`: bidirectional transformer blocks, mean-pooled to the central hidden state ``z [B, d]``, or
  (``pooled=False``, IGAMT's ``latent="per_step"``, as the authors' seq2seq memory) one state per step ``[B, L, d]``.
* :class:`EHRDecoder`: causal transformer blocks over ``[embedding + proj(z)]`` (a pooled ``z`` added to every step,
  a per-step ``z_k`` to step ``k``); :attr:`EHRDecoder.last` is the last
  layer (two heads, data and mask, each ``Linear(d -> F)`` + sigmoid). Output at position ``k`` reads inputs
  ``<= k`` only, so teacher forcing predicts step ``k + 1`` from steps ``<= k`` and synthesis is autoregressive.
* The imitator ``Dec_i`` is an :class:`EHRDecoder` body **without** a last layer of its own: :func:`generate` passes
  the decoder's ``last`` (the same ``Parameter`` objects) to it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor, nn


class OutputHeads(nn.Module):
    """Dec's last layer: hidden ``[..., d]`` -> ``(x, m)`` each ``[..., F]`` in ``(0, 1)``."""

    def __init__(self, d_model: int, num_features: int) -> None:
        super().__init__()
        self.data = nn.Linear(d_model, num_features)
        self.mask = nn.Linear(d_model, num_features)

    def forward(self, hidden: Tensor) -> tuple[Tensor, Tensor]:
        return torch.sigmoid(self.data(hidden)), torch.sigmoid(self.mask(hidden))


class Block(nn.Module):
    """Pre-norm transformer block (LayerNorm is per position, so it mixes no examples)."""

    def __init__(self, d_model: int, heads: int, d_ff: int, causal: bool) -> None:
        super().__init__()
        if d_model % heads:
            raise ValueError(f"d_model {d_model} must be divisible by heads {heads}")
        self.heads, self.causal = heads, causal
        self.norm1, self.norm2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.out = nn.Linear(d_model, d_model)
        self.ff = nn.Sequential(nn.Linear(d_model, d_ff), nn.GELU(), nn.Linear(d_ff, d_model))

    def forward(self, h: Tensor) -> Tensor:
        b, length, d = h.shape
        q, k, v = self.qkv(self.norm1(h)).view(b, length, 3, self.heads, d // self.heads).unbind(2)
        scores = torch.einsum("bqhc,bkhc->bhqk", q, k) / math.sqrt(d // self.heads)
        if self.causal:
            future = torch.ones(length, length, dtype=torch.bool, device=h.device).triu(1)
            scores = scores.masked_fill(future, float("-inf"))
        attended = torch.einsum("bhqk,bkhc->bqhc", scores.softmax(-1), v).reshape(b, length, d)
        h = h + self.out(attended)
        return h + self.ff(self.norm2(h))


class StepEmbedding(nn.Module):
    """Hidden states of the steps ``(x, m)``: input projection + position (+ time) (+ static features)."""

    def __init__(
        self, num_features: int, d_model: int, max_steps: int, num_static: int, time: bool, static: bool
    ) -> None:
        super().__init__()
        self.input = nn.Linear(2 * num_features, d_model)
        self.position = nn.Embedding(max_steps + 1, d_model)
        self.time = nn.Linear(2 * d_model, d_model) if time else None
        self.static = nn.Linear(num_static, d_model) if static else None
        self.num_static, self.d_model = num_static, d_model

    def forward(self, x: Tensor, m: Tensor) -> Tensor:
        length = x.shape[1]
        if length > self.position.num_embeddings:
            raise ValueError(f"{length} steps exceed the model's max_steps + 1 = {self.position.num_embeddings}")
        positions = torch.arange(length, device=x.device).expand(x.shape[0], length)  # one row per example
        h = self.input(torch.cat([x * m, m], dim=-1)) + self.position(positions)
        if self.time is not None:
            h = h + self.time(_sinusoids(cumulative_time(x, m), self.d_model))
        if self.static is not None:
            h = h + self.static(x[:, :1, : self.num_static])
        return h


def cumulative_time(x: Tensor, m: Tensor) -> Tensor:
    """``[B, L]``: 0 at the start step, then the running sum of the observed increments (feature 0); causal."""
    not_start = torch.ones(x.shape[1], device=x.device)
    not_start[0] = 0.0
    return (x[:, :, 0] * m[:, :, 0] * not_start).cumsum(dim=1)


def _sinusoids(t: Tensor, d_model: int) -> Tensor:
    frequencies = torch.exp(torch.arange(d_model, device=t.device) * (-math.log(1e3) / d_model))
    angles = t.unsqueeze(-1) * frequencies * 50.0
    return torch.cat([angles.sin(), angles.cos()], dim=-1)


class EHREncoder(nn.Module):
    """``(x, m) [B, L, F] -> z``: bidirectional blocks, then ``tanh(mean_k norm(h_k))`` ``[B, d]`` (``pooled``) or
    ``tanh(norm(h_k))`` per step ``[B, L, d]`` (``pooled=False``). The blocks are bidirectional, so a per-step
    ``z_k`` carries the later steps too, as an autoencoder's memory does; it is a code of the whole record."""

    def __init__(
        self, embedding: StepEmbedding, d_model: int, heads: int, d_ff: int, layers: int, pooled: bool = True
    ) -> None:
        super().__init__()
        self.embedding, self.pooled = embedding, pooled
        self.blocks = nn.ModuleList(Block(d_model, heads, d_ff, causal=False) for _ in range(layers))
        self.norm = nn.LayerNorm(d_model)

    def forward(self, x: Tensor, m: Tensor) -> Tensor:
        h = self.embedding(x, m)
        for block in self.blocks:
            h = block(h)
        return torch.tanh(self.norm(h).mean(dim=1)) if self.pooled else torch.tanh(self.norm(h))


class DecoderBody(nn.Module):
    """Dec without its last layer (also the imitator ``Dec_i``): ``(x, m, z) -> hidden [B, L, d]``, causal in
    ``(x, m)``: position ``k`` reads steps ``<= k``.

    ``z``: a pooled latent ``[B, d]``, ``latent(z)`` added to every step, or a per-step latent ``[B, L', d]`` with
    ``L' >= L``, ``latent(z_k)`` added to step ``k`` (``z`` is cut to the input's length, so synthesis draws ``z``
    for the whole record and each step reads its prefix). A per-step ``z`` from the encoder is bidirectional
    (:class:`EHREncoder`): ``z_k`` carries the later steps of the record, as the authors' seq2seq memory does.
    """

    def __init__(self, embedding: StepEmbedding, d_model: int, heads: int, d_ff: int, layers: int) -> None:
        super().__init__()
        self.embedding = embedding
        self.latent = nn.Linear(d_model, d_model)
        self.blocks = nn.ModuleList(Block(d_model, heads, d_ff, causal=True) for _ in range(layers))
        self.norm = nn.LayerNorm(d_model)

    def forward(self, x: Tensor, m: Tensor, z: Tensor) -> Tensor:
        length = x.shape[1]
        if z.dim() == 3 and z.shape[1] < length:
            raise ValueError(f"a per-step latent of {z.shape[1]} steps cannot condition {length} input steps")
        h = self.embedding(x, m) + (self.latent(z[:, :length]) if z.dim() == 3 else self.latent(z).unsqueeze(1))
        for block in self.blocks:
            h = block(h)
        return self.norm(h)


class EHRDecoder(nn.Module):
    """Dec = :class:`DecoderBody` + :attr:`last`. Teacher forcing: steps ``0..L-1`` -> predictions of ``1..L``."""

    def __init__(self, body: DecoderBody, last: OutputHeads) -> None:
        super().__init__()
        self.body, self.last = body, last

    def forward(self, x: Tensor, m: Tensor, z: Tensor) -> tuple[Tensor, Tensor]:
        return self.last(self.body(x, m, z))


def generate(
    body: DecoderBody, last: OutputHeads, z: Tensor, start_x: Tensor, start_m: Tensor, steps: int
) -> tuple[Tensor, Tensor]:
    """Autoregressive synthesis: step ``k + 1`` is ``last(body(steps 0..k))[k]``; returns ``[B, 1 + steps, F]``.

    The generated soft values ``(x, m)`` are fed back as they are (what the critics see in training).
    """
    xs, ms = start_x.unsqueeze(1), start_m.unsqueeze(1)
    for _ in range(steps):
        x_next, m_next = last(body(xs, ms, z)[:, -1:])
        xs, ms = torch.cat([xs, x_next], dim=1), torch.cat([ms, m_next], dim=1)
    return xs, ms


LATENTS = ("pooled", "per_step")
"""The latent kinds: one pooled latent per record (``z [B, d]``) or one per step (``z [B, L, d]``)."""


class Generator(nn.Module):
    """G: ``s ~ N(0, I) [B, noise_size] -> z~ [B, d]`` (an MLP, as the thesis code); with ``per_step``, the same MLP
    at each position of ``s [B, L, noise_size] -> z~ [B, L, d]`` (the steps' draws are independent). ``per_step``
    changes only the draws' shape (:meth:`noise_shape`), not the weights."""

    def __init__(self, noise_size: int, d_model: int, hidden: int, per_step: bool = False) -> None:
        super().__init__()
        self.noise_size, self.per_step = noise_size, per_step
        self.net = nn.Sequential(
            nn.Linear(noise_size, hidden), nn.LeakyReLU(0.2), nn.Linear(hidden, hidden), nn.LeakyReLU(0.2)
        )
        self.out = nn.Linear(hidden, d_model)

    def forward(self, s: Tensor) -> Tensor:
        return torch.tanh(self.out(self.net(s)))

    def noise_shape(self, n: int, length: int) -> tuple[int, ...]:
        """The shape of ``s`` for ``n`` records of ``length`` steps (``1 + T``, the start step included)."""
        return (n, length, self.noise_size) if self.per_step else (n, self.noise_size)


class SequenceCritic(nn.Module):
    """A WGAN critic on sequences ``[B, L, F] -> [B]`` (1-D convolutions over time, then mean pooling); also D_z on
    per-step latents ``[B, L, d]`` (``num_features=d``). Per example: no cross-example layer."""

    def __init__(self, num_features: int, hidden: int) -> None:
        super().__init__()
        self.conv = nn.Sequential(
            nn.Conv1d(num_features, hidden, 3, padding=1),
            nn.LeakyReLU(0.2),
            nn.Conv1d(hidden, hidden, 3, padding=1),
            nn.LeakyReLU(0.2),
        )
        self.out = nn.Linear(hidden, 1)

    def forward(self, x: Tensor) -> Tensor:
        return self.out(self.conv(x.transpose(1, 2)).mean(dim=2)).squeeze(-1)


class LatentCritic(nn.Module):
    """The WGAN critic D_z on central hidden states ``[B, d] -> [B]``."""

    def __init__(self, d_model: int, hidden: int) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(d_model, hidden), nn.LeakyReLU(0.2), nn.Linear(hidden, 1))

    def forward(self, z: Tensor) -> Tensor:
        return self.net(z).squeeze(-1)


def static_slots(static_continuous: int, static_groups: Sequence[int], num_features: int) -> int:
    """Width of the static part of step 0; refuses a layout that does not fit in ``num_features``."""
    if static_continuous < 0 or any(int(g) < 2 for g in static_groups):
        raise ValueError(
            f"static_continuous must be >= 0 and every one-hot group >= 2 wide, got {static_continuous}, "
            f"{list(static_groups)}"
        )
    width = static_continuous + sum(int(g) for g in static_groups)
    if width > num_features:
        raise ValueError(
            f"the static layout needs {width} slots in step 0 but steps have num_features={num_features}; "
            "lower static_continuous / static_groups or raise num_features"
        )
    return width


def sample_start(
    n: int,
    num_features: int,
    static_continuous: int,
    static_groups: Sequence[int],
    generator: torch.Generator | None = None,
) -> tuple[Tensor, Tensor]:
    """Start steps drawn from the static features' ranges alone (thesis 4.7 step 3): continuous slots uniform in
    ``[0, 1]`` (the scaled range), one category per one-hot group uniformly; mask 1 on the static slots, 0 on the
    padding. Needs no training data."""
    x = torch.zeros(n, num_features)
    x[:, :static_continuous] = torch.rand(n, static_continuous, generator=generator)
    offset = static_continuous
    for width in static_groups:
        chosen = torch.randint(int(width), (n,), generator=generator)
        x[torch.arange(n), offset + chosen] = 1.0
        offset += int(width)
    m = torch.zeros(n, num_features)
    m[:, :offset] = 1.0
    return x, m
