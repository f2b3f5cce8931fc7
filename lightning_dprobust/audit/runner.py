"""Privacy audits that train models: membership inference on a checkpoint and the one-run canary audit.

* :func:`checkpoint_membership_audit`: the attacks of :mod:`lightning_dprobust.audit.membership` on a trained
  classifier whose members are its data module's train split; shadow models follow a :class:`Recipe`.
* :func:`checkpoint_salem_audit`: the residual-perturbation paper's protocol (:mod:`lightning_dprobust.audit.salem`)
  on such a classifier, its one shadow model following the :class:`Recipe`.
* :func:`canary_audit`: Steinke, Nasr, Jagielski 2023, "Privacy Auditing with One (1) Training Run"
  (https://arxiv.org/abs/2305.08846): mislabeled canaries, each included with probability 1/2, ONE training run with
  the real pipeline (the recipe's :class:`~lightning_dprobust.callbacks.DPCallback` and LightningModule through a
  Lightning ``Trainer``), and an epsilon lower bound (:mod:`lightning_dprobust.audit.canaries`) to compare with
  the epsilon the accountant claims.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from torch.utils.data import ConcatDataset, DataLoader, Dataset, Subset, TensorDataset

from lightning_dprobust.audit.canaries import OneRunAudit, audit_guesses, choose_canaries
from lightning_dprobust.audit.membership import ATTACKS, MembershipReport, membership_audit, model_outputs
from lightning_dprobust.audit.roc import RocMetrics, roc_metrics
from lightning_dprobust.audit.salem import SalemReport, SalemSplit, salem_checkpoint_audit
from lightning_dprobust.data.base import ImageDataModule
from lightning_dprobust.methods.base import ClassifierModule
from lightning_dprobust.recipes import Recipe, fit_on_dataset, recipe_from_config


def zoo_recipe(name: str) -> tuple[Recipe, ImageDataModule]:
    """The recipe (config plus overrides) that trained zoo entry ``name``."""
    from lightning_dprobust import zoo
    from lightning_dprobust.zoo.build import recipe_config

    config, _ = recipe_config(zoo.info(name))
    return recipe_from_config(config, f"the recipe of zoo entry {name}")


@dataclass(frozen=True)
class TrainedModel:
    """A module trained by :func:`train_classifier` with the guarantee its accountant claims.

    Attributes:
        module: the trained module, in eval mode.
        epsilon: the claimed epsilon (``inf`` without DP).
        delta: the delta of that claim (``None`` without DP).
        history: the run's privacy ledger as ``(noise_multiplier, sample_rate, steps)`` events (empty without DP).
    """

    module: ClassifierModule
    epsilon: float
    delta: float | None
    history: tuple[tuple[float, float, int], ...] = ()


def train_classifier(
    recipe: Recipe,
    dataset: Dataset,
    device: str | torch.device = "cpu",
    module_class: Callable[[ClassifierModule], type[ClassifierModule]] | None = None,
) -> TrainedModel:
    """Train ``recipe`` on ``dataset`` through :func:`~lightning_dprobust.recipes.fit_on_dataset` (the path of
    ``dprobust fit``) and read the guarantee its ``DPCallback`` claims; ``module_class`` (see ``fit_on_dataset``)
    swaps the recipe's module class for a subclass built from it, e.g. one that adds audit canaries."""
    fitted = fit_on_dataset(recipe, dataset, device, module_class)
    if fitted.privacy is None:
        return TrainedModel(fitted.module, math.inf, None)
    history = tuple((e.noise_multiplier, e.sample_rate, e.steps) for e in fitted.privacy.ledger.history)
    return TrainedModel(fitted.module, fitted.privacy.epsilon(), fitted.privacy.delta, history)


class RecipeTrainer:
    """A :data:`~lightning_dprobust.audit.membership.TrainFn`: trains ``recipe`` on subsets of ``dataset``.

    Call ``j`` (from 1) uses seed ``recipe.seed + j``, so shadow models differ in initialization and sampling and the
    sequence is reproducible.
    """

    def __init__(self, recipe: Recipe, dataset: Dataset, device: str = "cpu") -> None:
        self.recipe, self.dataset, self.device = recipe, dataset, device
        self.calls = 0

    def __call__(self, indices: np.ndarray) -> torch.nn.Module:
        self.calls += 1
        recipe = self.recipe.replace(seed=self.recipe.seed + self.calls)
        subset = Subset(self.dataset, np.asarray(indices).tolist())
        return train_classifier(recipe, subset, self.device).module


def audit_splits(datamodule: ImageDataModule) -> tuple[Dataset, list[Dataset]]:
    """The train split and the held-out splits (validation, test) of ``datamodule``."""
    datamodule.setup("fit")
    if datamodule.test_set is None:
        datamodule.setup("test")
    held_out = [split for split in (datamodule.val_set, datamodule.test_set) if split is not None and len(split)]
    if datamodule.train_set is None or not held_out:
        raise ValueError(f"{type(datamodule).__name__} needs a train split and a validation or test split to audit")
    return datamodule.train_set, held_out


def checkpoint_membership_audit(
    model: torch.nn.Module,
    datamodule: ImageDataModule,
    recipe: Recipe | None,
    num_shadows: int = 8,
    attacks: tuple[str, ...] = ATTACKS,
    seed: int = 0,
    device: str = "cpu",
) -> MembershipReport:
    """Membership attacks on ``model``, trained on ``datamodule``'s train split (members); validation and test
    splits are the non-members. Shadow models follow ``recipe`` (``None``: the loss attack alone; see
    :func:`~lightning_dprobust.audit.membership.membership_audit` for the split and the attacks).
    """
    train, held_out = audit_splits(datamodule)
    dataset = ConcatDataset([train, *held_out])
    members, nonmembers = np.arange(len(train)), np.arange(len(train), len(dataset))
    trainer = RecipeTrainer(recipe, dataset, device) if recipe is not None else None
    return membership_audit(model, dataset, members, nonmembers, trainer, num_shadows, attacks, seed, device)


def checkpoint_salem_audit(
    model: torch.nn.Module,
    datamodule: ImageDataModule,
    recipe: Recipe,
    seed: int = 0,
    device: str = "cpu",
    **kwargs: float,
) -> tuple[SalemReport, SalemSplit]:
    """The Salem et al. protocol of the residual-perturbation paper on ``model``, trained on ``datamodule``'s train
    split (members; validation and test splits: non-members); its shadow model trains like ``recipe`` (see
    :func:`~lightning_dprobust.audit.salem.salem_checkpoint_audit` for the split; ``kwargs`` go to it)."""
    train, held_out = audit_splits(datamodule)
    dataset = ConcatDataset([train, *held_out])
    members, nonmembers = np.arange(len(train)), np.arange(len(train), len(dataset))
    trainer = RecipeTrainer(recipe, dataset, device)
    return salem_checkpoint_audit(model, dataset, members, nonmembers, trainer, seed, device, **kwargs)


@dataclass(frozen=True)
class CanaryReport:
    """The result of :func:`canary_audit`.

    Attributes:
        audit: the epsilon lower bound and the guesses behind it.
        claimed_epsilon: what the accountant reports for the run (``inf`` without DP).
        claimed_delta: the delta of that claim (``None`` without DP).
        canary_roc: ROC of the canary scores against their inclusion bits (``None`` if all coins came out alike).
        scores: each canary's score (minus the loss of its flipped label).
        included: which canaries were in the training set.
        test_accuracy: accuracy on the held-out examples that are not canaries.
        history: the run's privacy ledger, ``(noise_multiplier, sample_rate, steps)`` events (empty without DP).
    """

    audit: OneRunAudit
    claimed_epsilon: float
    claimed_delta: float | None
    canary_roc: RocMetrics | None
    scores: np.ndarray
    included: np.ndarray
    test_accuracy: float
    history: tuple[tuple[float, float, int], ...] = ()


def _tensors(dataset: Dataset) -> tuple[torch.Tensor, torch.Tensor]:
    batches = list(DataLoader(dataset, batch_size=4096))
    return torch.cat([x for x, _ in batches]), torch.cat([y for _, y in batches])


def canary_audit(
    recipe: Recipe,
    datamodule: ImageDataModule,
    num_canaries: int,
    beta: float = 0.05,
    delta: float | None = None,
    device: str = "cpu",
) -> CanaryReport:
    """One-run audit (Steinke et al. 2023) of ``recipe`` on ``datamodule``.

    ``num_canaries`` held-out examples (validation + test splits, so no canary duplicates a training image) get a
    flipped label (:func:`~lightning_dprobust.audit.canaries.choose_canaries`); each joins the train split with
    probability 1/2; the recipe trains ONCE; each canary's score is minus the loss of its flipped label; the bound
    searches :func:`~lightning_dprobust.audit.canaries.guess_grid` with a union bound at confidence ``1 - beta``.

    Args:
        delta: delta of the tested hypothesis; default the run's DP delta, else ``1e-5``.
    """
    train, held_out = audit_splits(datamodule)
    images, labels = _tensors(ConcatDataset(held_out))
    chosen, canary_labels, included = choose_canaries(
        len(labels), num_canaries, datamodule.num_classes, labels.numpy(), recipe.seed
    )
    canaries = TensorDataset(images[chosen], torch.from_numpy(canary_labels))
    training_set = ConcatDataset([train, Subset(canaries, np.flatnonzero(included).tolist())])
    trained = train_classifier(recipe, training_set, device)
    logits, _ = model_outputs(trained.module, canaries, device=device)
    scores = (-torch.nn.functional.cross_entropy(logits, canaries.tensors[1], reduction="none")).numpy()
    rest = np.setdiff1d(np.arange(len(labels)), chosen)
    rest_logits, _ = model_outputs(trained.module, TensorDataset(images[rest], labels[rest]), device=device)
    accuracy = float((rest_logits.argmax(1) == labels[rest]).float().mean()) if len(rest) else math.nan
    tested_delta = delta if delta is not None else (trained.delta if trained.delta is not None else 1e-5)
    audit = audit_guesses(scores, included, beta=beta, delta=tested_delta)
    roc = roc_metrics(scores, included) if 0 < included.sum() < len(included) else None
    return CanaryReport(audit, trained.epsilon, trained.delta, roc, scores, included, accuracy, trained.history)
