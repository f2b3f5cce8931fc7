"""White-box one-run audit of DP-SGD with Dirac gradient canaries (Steinke, Nasr, Jagielski 2023, Section 7).

"Privacy Auditing with One (1) Training Run" (NeurIPS 2023, https://arxiv.org/abs/2305.08846). The auditor adds a
canary tap to the audited module: a linear layer ``w`` from ``m`` inputs to one output, without bias, initialized to
zero. Canary ``i`` is a fake training example whose loss is the tap's output on ``K e_i``, so its gradient is
``K e_i`` on ``w`` and zero elsewhere (``K = 10 max_grad_norm``, so clipping brings it to ``max_grad_norm e_i``, the
largest contribution one example may make); a real example feeds the tap zeros, so its gradient on ``w`` is exactly
zero and the tap never changes its loss. Each canary joins the training set with probability 1/2, independently of
everything else; from then on it is an ordinary example of the run: Poisson-sampled, clipped, noised and counted by
the real :class:`~lightning_dprobust.callbacks.DPCallback` (the training set and ``n`` include it), with the
per-example clipping engine the audit is given (``vmap``, ``ghost`` or ``auto``): the tap is a plain linear layer, so
every engine clips it through its own rule. The auditor reads the private gradient the optimizer receives on ``w``
at every step and scores each canary two ways:

* ``sum``: the sum over steps (the paper's score): high when the canary's gradient was added;
* ``steps``: the sum of squared differences between consecutive steps, which cancels any noise that repeats from one
  step to the next; an included canary adds ``max_grad_norm^2`` whenever it enters or leaves the batch.

Each score is turned into an epsilon lower bound at confidence ``1 - beta / 2`` by the same one-run bound as the
black-box audit (:func:`lightning_dprobust.audit.canaries.audit_guesses`); by the union bound the larger of the
two is a lower bound at confidence ``1 - beta``. The bound is valid for any scores computed without looking at the
inclusion bits; its strength depends on the run (more steps and more canaries give tighter bounds).

What the canaries see: how the engine clips and sums the examples' gradients and noises the sum. A fault confined to
the engine's rule for a layer type the tap is not (a convolution's norm, say) reaches the canaries only through the
real examples' clipping, not through their own gradients.

Assumptions: the recipe's method computes its loss through ``per_example_loss`` (every method here does), and the
model holds at least ``m`` trainable coordinates (so the tap at most doubles the audited parameters).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn
from torch.utils.data import ConcatDataset, Dataset, TensorDataset

from lightning_dprobust.audit.canaries import OneRunAudit, audit_guesses
from lightning_dprobust.audit.runner import Recipe, audit_splits, train_classifier
from lightning_dprobust.core.engines import ENGINES
from lightning_dprobust.data.base import ImageDataModule
from lightning_dprobust.data.validation import check_batch
from lightning_dprobust.methods.base import ClassifierModule

CANARY_GRADIENT_SCALE = 10.0
"""A canary's raw gradient norm in units of ``max_grad_norm``; clipping must bring it down to ``max_grad_norm``."""
NOT_A_CANARY = -1
SCORES = ("sum", "steps")


@dataclass(frozen=True)
class WhiteBoxReport:
    """The result of :func:`white_box_audit`.

    Attributes:
        audit: the larger of the two scores' bounds, each at confidence ``1 - beta / 2``.
        score: which score gave it (``"sum"`` or ``"steps"``).
        claimed_epsilon: what the run's accountant reports.
        claimed_delta: the delta of that claim.
        history: the run's privacy ledger, ``(noise_multiplier, sample_rate, steps)`` events.
        scores: ``score -> per-canary scores``.
        included: which canaries were in the training set.
        engine: the per-example clipping engine the audited run was given.
    """

    audit: OneRunAudit
    score: str
    claimed_epsilon: float
    claimed_delta: float
    history: tuple[tuple[float, float, int], ...]
    scores: dict[str, np.ndarray]
    included: np.ndarray
    engine: str


class _RealExamples(Dataset):
    """``(x, y) -> (x, y, NOT_A_CANARY)``."""

    def __init__(self, dataset: Dataset) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> tuple[Tensor, Tensor, Tensor]:
        x, y = self.dataset[index]
        return x, torch.as_tensor(y), torch.tensor(NOT_A_CANARY)


def with_gradient_canaries(
    method: type[ClassifierModule], num_canaries: int, max_grad_norm: float
) -> type[ClassifierModule]:
    """A subclass of ``method`` whose examples ``(x, y, s)`` with ``s >= 0`` are canary ``s``: gradient ``K e_s`` on
    its ``canary_tap`` (module docstring), ``K = CANARY_GRADIENT_SCALE * max_grad_norm``; examples with
    ``s = NOT_A_CANARY`` are the method's own. After every optimizer step the module records the private gradient
    applied on the tap in ``canary_gradients`` (one ``[num_canaries]`` row per step).
    """
    scale = CANARY_GRADIENT_SCALE * max_grad_norm

    class GradientCanaries(method):
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            size = sum(p.numel() for p in self.parameters() if p.requires_grad)
            if not 1 <= num_canaries <= size:
                raise ValueError(f"{num_canaries} gradient canaries need as many trainable coordinates; {size} exist")
            self.canary_tap = nn.Linear(num_canaries, 1, bias=False)
            nn.init.zeros_(self.canary_tap.weight)
            self.canary_gradients: list[Tensor] = []

        def training_step(self, batch: tuple[Tensor, Tensor, Tensor], batch_idx: int) -> Tensor:
            x, y, canary = batch
            if self.private_step is None:
                raise RuntimeError("the white-box audit needs a DPCallback: gradient canaries are private examples")
            check_batch(x, y, self.num_classes, self.input_shape)
            inputs = self.training_inputs((x, y))
            for transform in self.train_input_transforms:
                inputs = transform(self, inputs)
            return self.private_step((*inputs, canary))

        def per_example_loss(self, *inputs: Tensor) -> Tensor:
            *example, canary = inputs
            slots = torch.arange(num_canaries, device=canary.device)
            one_hot = (canary[:, None] == slots).to(self.canary_tap.weight.dtype)  # all zeros for a real example
            dirac = scale * self.canary_tap(one_hot).squeeze(1)
            return torch.where(canary >= 0, dirac, super().per_example_loss(*example))

        def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
            super().on_train_batch_end(outputs, batch, batch_idx)
            self.canary_gradients.append(self.canary_tap.weight.grad[0].detach().cpu())

    return GradientCanaries


def canary_scores(gradients: np.ndarray) -> dict[str, np.ndarray]:
    """``{"sum": ..., "steps": ...}`` scores of each canary from its ``[steps, m]`` private gradients (module doc)."""
    gradients = np.asarray(gradients, dtype=np.float64)
    return {"sum": gradients.sum(axis=0), "steps": (np.diff(gradients, axis=0) ** 2).sum(axis=0)}


def white_box_audit(
    recipe: Recipe,
    datamodule: ImageDataModule,
    num_canaries: int,
    beta: float = 0.05,
    delta: float | None = None,
    device: str = "cpu",
    seed: int = 0,
    engine: str | None = None,
) -> WhiteBoxReport:
    """One-run white-box audit (module docstring) of the DP ``recipe`` on ``datamodule``'s train split.

    ``seed`` draws the canaries' inclusion coins (training itself uses ``recipe.seed``).

    Args:
        delta: delta of the tested hypothesis; default the run's DP delta.
        engine: the per-example clipping engine of the audited run (``"auto"``, ``"ghost"`` or ``"vmap"``); default
            the recipe's own (its ``dp.engine``, else ``"auto"``), so that the audit sees the engine the run uses.

    Raises:
        ValueError: the recipe trains without DP, ``engine`` is unknown, or ``num_canaries`` is below 2 or above the
            model's trainable coordinates.
    """
    if recipe.dp is None:
        raise ValueError("the white-box audit audits a DP run: give a recipe with a DPCallback (no --no-dp)")
    engine = audited_engine(recipe, engine)
    if num_canaries < 2:
        raise ValueError(f"the white-box audit needs at least 2 canaries, got {num_canaries}")
    train, _ = audit_splits(datamodule)
    included = np.random.default_rng([seed, 1]).random(num_canaries) < 0.5
    slots = torch.as_tensor(np.flatnonzero(included), dtype=torch.long)
    images = torch.zeros(len(slots), *datamodule.input_shape)
    canaries = TensorDataset(images, torch.zeros(len(slots), dtype=torch.long), slots)
    max_grad_norm = float(recipe.dp.get("max_grad_norm", 1.0))

    def add_canaries(method: type[ClassifierModule]) -> type[ClassifierModule]:
        return with_gradient_canaries(method, num_canaries, max_grad_norm)

    audited = recipe.replace(dp=recipe.dp | {"engine": engine})
    trained = train_classifier(audited, ConcatDataset([_RealExamples(train), canaries]), device, add_canaries)
    scores = canary_scores(torch.stack(trained.module.canary_gradients).numpy())
    tested_delta = delta if delta is not None else trained.delta
    audits = {
        name: audit_guesses(s, included, beta=beta / len(scores), delta=tested_delta) for name, s in scores.items()
    }
    best = max(audits, key=lambda name: audits[name].epsilon_lower_bound)
    return WhiteBoxReport(audits[best], best, trained.epsilon, trained.delta, trained.history, scores, included, engine)


def audited_engine(recipe: Recipe, engine: str | None) -> str:
    """``engine`` if given, else the recipe's ``dp.engine``, else ``"auto"`` (``DPCallback``'s default).

    Raises:
        ValueError: the engine is not one of ``ENGINES``.
    """
    chosen = engine if engine is not None else (recipe.dp or {}).get("engine", "auto")
    if chosen not in ENGINES:
        raise ValueError(f"the white-box audit's engine must be one of {ENGINES}, got {chosen!r}")
    return chosen
