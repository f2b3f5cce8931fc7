"""Privacy audits that train models: membership inference on a checkpoint and the one-run canary audit.

* :func:`checkpoint_membership_audit`: the attacks of :mod:`lightning_dprobust.evaluation.membership` on a trained
  classifier whose members are its data module's train split; shadow models follow a :class:`Recipe`.
* :func:`canary_audit`: Steinke, Nasr, Jagielski 2023, "Privacy Auditing with One (1) Training Run"
  (https://arxiv.org/abs/2305.08846): mislabeled canaries, each included with probability 1/2, ONE training run with
  the real pipeline (the recipe's :class:`~lightning_dprobust.callbacks.DPCallback` and LightningModule through a
  Lightning ``Trainer``), and an epsilon lower bound (:mod:`lightning_dprobust.evaluation.canaries`) to compare with
  the epsilon the accountant claims.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import logging
import math
import os
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import lightning as L
import numpy as np
import torch
import yaml
from torch.utils.data import ConcatDataset, DataLoader, Dataset, Subset, TensorDataset

from lightning_dprobust.callbacks import DPCallback
from lightning_dprobust.data.base import ImageDataModule
from lightning_dprobust.evaluation.canaries import OneRunAudit, audit_guesses, choose_canaries
from lightning_dprobust.evaluation.membership import ATTACKS, MembershipReport, membership_audit, model_outputs
from lightning_dprobust.evaluation.roc import RocMetrics, roc_metrics
from lightning_dprobust.methods.base import ClassifierModule

_DATA_ATTRIBUTES = ("num_classes", "input_shape", "mean", "std")
_EXPECTED_WARNINGS = ".*(does not have many workers|no `val_dataloader`|LeafSpec).*"
"""Lightning warnings that every audit fit would repeat: few loader workers, no validation loop."""


@dataclass(frozen=True)
class Recipe:
    """How to train a classifier: the LightningModule and its arguments, batch size, epochs, DP and seed.

    Attributes:
        module_class: a :class:`ClassifierModule` subclass.
        module_kwargs: its arguments; the data module's ``num_classes``, ``input_shape``, ``mean`` and ``std`` are
            added where missing (as the CLI links them).
        batch_size: the train loader's batch size (under DP: the expected Poisson batch size).
        max_epochs: epochs.
        dp: arguments of :class:`DPCallback`, or ``None`` to train without DP.
        seed: seed of the initialization, the shuffling and the Poisson sampler.
    """

    module_class: type[ClassifierModule]
    module_kwargs: dict[str, Any] = field(default_factory=dict)
    batch_size: int = 256
    max_epochs: int = 40
    dp: dict[str, Any] | None = None
    seed: int = 0

    def replace(self, **changes: Any) -> Recipe:
        """A copy with ``changes`` applied."""
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_module(cls, module: ClassifierModule, batch_size: int = 256, max_epochs: int = 40) -> Recipe:
        """The non-private recipe of a trained module: its class and every hyperparameter but the data's (the method's
        own, such as residual perturbation's noise and ensemble size, included)."""
        kwargs = {
            key: value
            for key, value in module.hparams.items()
            if key not in _DATA_ATTRIBUTES and not key.startswith("_") and key != "pretrained"
        }
        return cls(type(module), kwargs, batch_size, max_epochs)


def _import(class_path: str, base: type, where: str) -> type:
    module_name, _, name = class_path.rpartition(".")
    try:
        cls = getattr(importlib.import_module(module_name), name)
    except (ImportError, AttributeError, ValueError) as error:
        raise ValueError(f"{where}: cannot import {class_path!r}: {error}") from error
    if not (isinstance(cls, type) and issubclass(cls, base)):
        raise ValueError(f"{where}: {class_path} is not a {base.__name__} subclass")
    return cls


def load_recipe(path: str | os.PathLike) -> tuple[Recipe, ImageDataModule]:
    """The recipe and data module of a ``dprobust fit`` config file (``configs/<method>/<dataset>.yaml``).

    Raises:
        FileNotFoundError: the file does not exist.
        ValueError: see :func:`recipe_from_config`.
    """
    if not os.path.isfile(path):
        raise FileNotFoundError(f"config {path} does not exist: pass e.g. configs/dpsgd/digits.yaml")
    with open(path) as stream:
        return recipe_from_config(yaml.safe_load(stream) or {}, str(path))


def zoo_recipe(name: str) -> tuple[Recipe, ImageDataModule]:
    """The recipe (config plus overrides) that trained zoo entry ``name``."""
    from lightning_dprobust import zoo
    from lightning_dprobust.zoo_build import recipe_config

    config, _ = recipe_config(zoo.info(name))
    return recipe_from_config(config, f"the recipe of zoo entry {name}")


def recipe_from_config(config: dict[str, Any], where: str) -> tuple[Recipe, ImageDataModule]:
    """The recipe and data module of a parsed config.

    Reads ``seed_everything``, ``trainer.max_epochs``, the ``DPCallback`` entry of ``trainer.callbacks`` (other
    callbacks and the logger are ignored), ``model`` and ``data`` (``class_path`` + ``init_args``).

    Raises:
        ValueError: the config lacks a part above or names classes of the wrong kind.
    """
    try:
        model, data, trainer = config["model"], config["data"], config.get("trainer") or {}
        module_class = _import(model["class_path"], ClassifierModule, f"{where}: model")
        data_class = _import(data["class_path"], ImageDataModule, f"{where}: data")
    except (KeyError, TypeError) as error:
        raise ValueError(f"{where} needs model and data sections with class_path (and init_args): {error}") from error
    dp = [
        entry.get("init_args", {})
        for entry in trainer.get("callbacks") or []
        if str(entry.get("class_path", "")).endswith("DPCallback")
    ]
    datamodule = data_class(**(data.get("init_args") or {}))
    recipe = Recipe(
        module_class=module_class,
        module_kwargs=dict(model.get("init_args") or {}),
        batch_size=datamodule.batch_size,
        max_epochs=int(trainer.get("max_epochs") or 40),
        dp=dict(dp[0]) if dp else None,
        seed=int(config.get("seed_everything") or 0),
    )
    return recipe, datamodule


class _DatasetModule(L.LightningDataModule):
    """A data module around one training dataset, so that :class:`DPCallback` can Poisson-sample it."""

    def __init__(self, dataset: Dataset, batch_size: int, seed: int) -> None:
        super().__init__()
        self.dataset, self.batch_size, self.seed = dataset, batch_size, seed

    def train_dataloader(self) -> DataLoader:
        generator = torch.Generator().manual_seed(self.seed)
        return DataLoader(
            self.dataset, batch_size=min(self.batch_size, len(self.dataset)), shuffle=True, generator=generator
        )


@dataclass(frozen=True)
class TrainedModel:
    """A module trained by :func:`train_classifier` with the guarantee its accountant claims.

    Attributes:
        module: the trained module, in eval mode.
        epsilon: the claimed epsilon (``inf`` without DP).
        delta: the delta of that claim (``None`` without DP).
    """

    module: ClassifierModule
    epsilon: float
    delta: float | None


def _accelerator(device: str | torch.device) -> str:
    return "gpu" if torch.device(device).type == "cuda" else "cpu"


def train_classifier(
    recipe: Recipe, dataset: Dataset, datamodule: ImageDataModule, device: str | torch.device = "cpu"
) -> TrainedModel:
    """Train ``recipe`` on ``dataset`` with a Lightning ``Trainer`` (and ``DPCallback`` if ``recipe.dp``).

    ``datamodule`` supplies only the dataset attributes the model needs (classes, input shape, normalization). The
    global torch random state is restored afterwards, so training does not disturb the caller's randomness.
    """
    data_kwargs = {key: getattr(datamodule, key) for key in _DATA_ATTRIBUTES}
    callbacks = [DPCallback(**({"seed": recipe.seed} | recipe.dp))] if recipe.dp is not None else []
    with torch.random.fork_rng(devices=[]), warnings.catch_warnings(), _quiet_lightning():
        warnings.filterwarnings("ignore", message=_EXPECTED_WARNINGS)
        torch.manual_seed(recipe.seed)
        module = recipe.module_class(**(data_kwargs | recipe.module_kwargs))
        trainer = L.Trainer(
            accelerator=_accelerator(device),
            devices=1,
            max_epochs=recipe.max_epochs,
            callbacks=callbacks,
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            limit_val_batches=0,
            num_sanity_val_steps=0,
            use_distributed_sampler=False,
        )
        trainer.fit(module, _DatasetModule(dataset, recipe.batch_size, recipe.seed))
    if not callbacks:
        return TrainedModel(module.eval(), math.inf, None)
    return TrainedModel(module.eval(), callbacks[0].epsilon(), callbacks[0].delta)


@contextlib.contextmanager
def _quiet_lightning() -> Iterator[None]:
    """Silence Lightning's per-fit info lines (devices, TPU/HPU availability) for the many shadow fits."""
    logger = logging.getLogger("lightning.pytorch")
    level = logger.level
    logger.setLevel(logging.WARNING)
    try:
        yield
    finally:
        logger.setLevel(level)


class RecipeTrainer:
    """A :data:`~lightning_dprobust.evaluation.membership.TrainFn`: trains ``recipe`` on subsets of ``dataset``.

    Call ``j`` (from 0) uses seed ``recipe.seed + 1 + j``, so shadow models differ in initialization and sampling and
    the sequence is reproducible.
    """

    def __init__(self, recipe: Recipe, dataset: Dataset, datamodule: ImageDataModule, device: str = "cpu") -> None:
        self.recipe, self.dataset, self.datamodule, self.device = recipe, dataset, datamodule, device
        self.calls = 0

    def __call__(self, indices: np.ndarray) -> torch.nn.Module:
        self.calls += 1
        recipe = self.recipe.replace(seed=self.recipe.seed + self.calls)
        subset = Subset(self.dataset, np.asarray(indices).tolist())
        return train_classifier(recipe, subset, self.datamodule, self.device).module


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
    :func:`~lightning_dprobust.evaluation.membership.membership_audit` for the split and the attacks).
    """
    train, held_out = audit_splits(datamodule)
    dataset = ConcatDataset([train, *held_out])
    members, nonmembers = np.arange(len(train)), np.arange(len(train), len(dataset))
    trainer = RecipeTrainer(recipe, dataset, datamodule, device) if recipe is not None else None
    return membership_audit(model, dataset, members, nonmembers, trainer, num_shadows, attacks, seed, device)


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
    """

    audit: OneRunAudit
    claimed_epsilon: float
    claimed_delta: float | None
    canary_roc: RocMetrics | None
    scores: np.ndarray
    included: np.ndarray
    test_accuracy: float


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
    flipped label (:func:`~lightning_dprobust.evaluation.canaries.choose_canaries`); each joins the train split with
    probability 1/2; the recipe trains ONCE; each canary's score is minus the loss of its flipped label; the bound
    searches :func:`~lightning_dprobust.evaluation.canaries.guess_grid` with a union bound at confidence ``1 - beta``.

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
    trained = train_classifier(recipe, training_set, datamodule, device)
    logits, _ = model_outputs(trained.module, canaries, device=device)
    scores = (-torch.nn.functional.cross_entropy(logits, canaries.tensors[1], reduction="none")).numpy()
    rest = np.setdiff1d(np.arange(len(labels)), chosen)
    rest_logits, _ = model_outputs(trained.module, TensorDataset(images[rest], labels[rest]), device=device)
    accuracy = float((rest_logits.argmax(1) == labels[rest]).float().mean()) if len(rest) else math.nan
    tested_delta = delta if delta is not None else (trained.delta if trained.delta is not None else 1e-5)
    audit = audit_guesses(scores, included, beta=beta, delta=tested_delta)
    roc = roc_metrics(scores, included) if 0 < included.sum() < len(included) else None
    return CanaryReport(audit, trained.epsilon, trained.delta, roc, scores, included, accuracy)
