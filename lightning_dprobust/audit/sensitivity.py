"""The sensitivity catalogue: does one example move the clipped sum an engine releases by more than ``C``?

For adversarial neighbouring batches, ``B - 1`` copies of one example with an all-ones canary against the same copies
without it (the canary under two labels), the clipped sum each engine releases (before noise) may move by at most
``C (1 + 1e-5)`` (docs/design.md, contract 11). The catalogue holds models that mix examples in training mode only,
through running statistics, through the batch's mean, through attention across the batch, a loss that starts to mix at
the second step, and separable ones (tied weights, the CNN). A mixing model must be refused (the engine raises, so
nothing is released) or run within the bound.

The other mechanisms' tests in ``tests/privacy/`` use the same protocol: the generative modules (IGAMT, the EHR
baselines) with the canary appended to their own batch, TransDenoiser's release per parameter slice on
:func:`canary_pairs`, and StoBatch's releases on :func:`neighbours`; the table below covers the engines only.

Known limit: without the probe, a loss that starts to mix examples after the first check runs unchecked until the
next periodic check (``CHECK_EVERY`` steps), which then stops the run; the table shows that window's sensitivity.

Run ``python -m lightning_dprobust.audit.sensitivity`` for the table: model, engine, refused or the measured
sensitivity / C (the largest over both labels and both protocols: the adversarial batch first, or after a warm-up step).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator

import torch
import torch.nn.functional as F
from torch import nn

from lightning_dprobust.core.engines import build_clipper
from lightning_dprobust.methods import DPSGD, DPAdv, DPCert

C = 1.0
BOUND = C * (1 + 1e-5)
BATCH = 16
HIDDEN = 12


class BatchStandardize(nn.Module):
    """Parameter-free batch standardization in training mode only (identity in eval mode)."""

    def forward(self, x):
        if not self.training:
            return x
        return (x - x.mean(dim=0)) / (x.var(dim=0, unbiased=False) + 1e-3).sqrt()


class FunctionalBatchNorm(nn.Module):
    """``F.batch_norm`` with running statistics, written as a plain module (not a ``_BatchNorm``)."""

    def __init__(self):
        super().__init__()
        self.register_buffer("running_mean", torch.zeros(HIDDEN))
        self.register_buffer("running_var", torch.ones(HIDDEN))

    def forward(self, x):
        return F.batch_norm(x, self.running_mean, self.running_var, training=self.training)


class BatchCentering(nn.Module):
    def forward(self, x):
        return x - x.mean(dim=0, keepdim=True)


class InBatchAttention(nn.Module):
    """Each example attends to every example of the batch."""

    def forward(self, x):
        return x + torch.softmax(x @ x.T / math.sqrt(x.shape[1]), dim=1) @ x


class TiedTwice(nn.Module):
    """One linear layer applied twice (tied weights)."""

    def __init__(self):
        super().__init__()
        self.shared = nn.Linear(HIDDEN, HIDDEN)

    def forward(self, x):
        return self.shared(torch.tanh(self.shared(x)))


class LateMixing(DPSGD):
    """A per-example loss that gets, from its second step on, a term on the batch's mean logits."""

    mixing = False

    def per_example_loss(self, x, y):
        losses = super().per_example_loss(x, y)
        if self.mixing:
            logits = self(x)
            losses = losses + 10 * (logits - logits.mean(dim=0)).pow(2).sum(dim=1)
        return losses


def _classifier(middle: nn.Module) -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(64, HIDDEN), nn.Tanh(), middle, nn.Tanh(), nn.Linear(HIDDEN, 10))


SEPARABLE = {
    "plain": nn.Identity,
    "tied weights": TiedTwice,
    "cnn_tanh": None,
    "DP-CERT (consistency, 2 noisy views)": None,
    "DP-Adv (PGD-3 views)": None,
}
MIXING = {
    "train-only batch standardization": BatchStandardize,
    "F.batch_norm with running statistics": FunctionalBatchNorm,
    "batch centering": BatchCentering,
    "in-batch attention": InBatchAttention,
    "loss mixing from step 2": nn.Identity,
}


def build_module(case: str) -> DPSGD:
    shape = {"num_classes": 10, "input_shape": (1, 8, 8)}
    if case.startswith("DP-CERT"):
        return DPCert(regularizer="consistency", num_augmentations=2, model="cnn_tanh", **shape).train()
    if case.startswith("DP-Adv"):
        return DPAdv(attack="PGD", attack_eps=0.1, attack_kwargs={"steps": 3}, model="cnn_tanh", **shape).train()
    kind = LateMixing if case == "loss mixing from step 2" else DPSGD
    layer = {**SEPARABLE, **MIXING}[case]
    model = "cnn_tanh" if layer is None else _classifier(layer())
    return kind(model=model, **shape).train()


def neighbours(label: int) -> tuple[tuple[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]:
    """``B - 1`` copies of one example and an all-ones canary labelled ``label`` (last); the copies alone."""
    copy = torch.rand(1, 1, 8, 8, generator=torch.Generator().manual_seed(1)).expand(BATCH - 1, 1, 8, 8)
    with_canary = (
        torch.cat([copy, torch.ones(1, 1, 8, 8)]),
        torch.cat([torch.full((BATCH - 1,), 3), torch.tensor([label])]),
    )
    return with_canary, (copy.clone(), torch.full((BATCH - 1,), 3))


def _warm_up_batch() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(2)
    return torch.rand(BATCH, 1, 8, 8, generator=generator), torch.randint(0, 10, (BATCH,), generator=generator)


def canary_pairs(module: nn.Module) -> Iterator[tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...]]]:
    """For each canary label of :func:`neighbours`: the method's per-example inputs (views, adversarial examples,
    noisy inputs) of the batch with the canary, and its neighbour, the same inputs without the canary's row, so both
    share every other example's inputs exactly. Drawn one pair at a time (the inputs may use random draws)."""
    for label in (0, 7):
        inputs = module.training_inputs(neighbours(label)[0])
        yield inputs, tuple(t[:-1] for t in inputs)


def distance(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], names: Iterable[str] | None = None) -> float:
    """L2 distance between two clipped sums (``name -> tensor``), over ``names`` (default: all of ``a``)."""
    names = a if names is None else names
    return math.sqrt(sum(float((a[name] - b[name]).double().square().sum()) for name in names))


ENGINES = ("vmap", "ghost", "auto", "ghost+probe")
"""``ghost+probe``: the ghost engine with its per-step probe (``DPCallback(probe=True)``)."""


def released_distances(case: str, engine: str, warm_up: bool) -> list[float] | str:
    """The distances between the neighbours' clipped sums, or the refusal (the exception the engine raised).

    The model's initialization and the method's own draws (DP-CERT's noisy views, PGD's random starts) come from
    torch's global generator seeded to 0 inside a fork, so the catalogue is the same at every run and the caller's
    generator is left as it was. None of these draws is a DP mechanism's noise: the catalogue compares clipped sums
    before any noise is added."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return _released_distances(build_module(case), engine, warm_up)


def _released_distances(module: DPSGD, engine: str, warm_up: bool) -> list[float] | str:
    name, _, probe = engine.partition("+")
    clipper, _ = build_clipper(name, module, "per_example_loss", C, probe=bool(probe))
    distances = []
    try:
        if warm_up:
            clipper(module.training_inputs(_warm_up_batch()))
        if isinstance(module, LateMixing):
            clipper(module.training_inputs(_warm_up_batch()))  # step 1: separable
            module.mixing = True
        for inputs, without in canary_pairs(module):
            distances.append(distance(clipper(inputs).grads, clipper(without).grads))
    except Exception as error:  # the engine refused: nothing was released
        return f"refused: {type(error).__name__}"
    return distances


COLUMNS = ("model", "engine", "outcome (sensitivity / C, or refused)")


def catalogue_rows() -> list[tuple[str, str, str]]:
    """One row per (case, engine): the refusals met and the largest released distance in units of ``C``, over both
    protocols (the adversarial batch as the engine's first, or after a warm-up step)."""
    rows = []
    for case in [*MIXING, *SEPARABLE]:
        for engine in ENGINES:
            outcomes = [released_distances(case, engine, warm_up) for warm_up in (False, True)]
            refused = sorted({o for o in outcomes if isinstance(o, str)})
            measured = [d for o in outcomes if isinstance(o, list) for d in o]
            parts = refused + ([f"{max(measured) / C:.4f}"] if measured else [])
            rows.append((case, engine, "; ".join(parts)))
    return rows


def main() -> None:
    """Print the catalogue's table (markdown)."""
    print("| " + " | ".join(COLUMNS) + " |")
    print("|---|---|---|")
    for row in catalogue_rows():
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
