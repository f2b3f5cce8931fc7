"""The one config-to-trainer path: :class:`DProbustCLI` (``dprobust fit|validate|test``) and the recipe helpers that
run a ``dprobust fit`` config from Python exactly as the command line would (demo, zoo builds, audits, benchmarks).

A config names the DP-SGD arguments once, in the ``dp`` group (``dp: {target_epsilon: 3.0, ...}`` in YAML,
``--dp.target_epsilon 1.0`` on the command line, ``--dp null`` to train without DP); the group becomes the trainer's
:class:`~lightning_dprobust.callbacks.DPCallback`.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import os
import tempfile
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import lightning as L
import torch
import yaml
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from torch.utils.data import DataLoader, Dataset

from lightning_dprobust.callbacks import DPCallback
from lightning_dprobust.callbacks.guard import TrainingGuard
from lightning_dprobust.callbacks.run import (
    BestValidation,
    LedgerLogger,
    SaveConfigOnce,
    refuse_used_folder,
    report_fit,
    require_last_checkpoint,
    resume_wandb_run,
)
from lightning_dprobust.checkpoint_io import read_checkpoint
from lightning_dprobust.data.base import ImageDataModule
from lightning_dprobust.methods.base import ClassifierModule
from lightning_dprobust.paths import shipped_root

CONFIG_DIR = shipped_root() / "configs"
"""The shipped recipes, ``configs/<method>/<dataset>.yaml``."""
BASE_CONFIG = CONFIG_DIR / "base" / "trainer.yaml"
"""The trainer settings every recipe shares (devices, the W&B logger, the checkpoint callback), read before any config
(jsonargparse's ``default_config_files``): a recipe names only what differs."""

_EXPECTED_WARNINGS = ".*(does not have many workers|no `val_dataloader`|LeafSpec|LightningCLI's args parameter).*"
"""Warnings every programmatic fit would repeat: few loader workers, no validation loop, ``args=`` with ``sys.argv``."""


class DProbustCLI(LightningCLI):
    """LightningCLI whose model and data are any LightningModule / LightningDataModule subclass: the classifiers
    (:class:`ClassifierModule` on an :class:`ImageDataModule`) and the generative models (IGAMT and its baselines on
    the EHR data module, which carry their DP arguments themselves).

    For classifiers, the data module's ``num_classes``, ``input_shape``, ``mean`` and ``std`` are linked into the
    model, so a config names the dataset once; the optional ``dp`` group is a :class:`DPCallback` added to the
    trainer, and a :class:`~lightning_dprobust.callbacks.guard.TrainingGuard` stops training at a non-finite loss or
    weight.
    Checkpoints are written atomically (:class:`AtomicCheckpointIO`); ``--ckpt_path`` is read with
    ``weights_only=True`` before Lightning touches it; ``config.yaml`` is written once training starts and never over
    another run's (:class:`~lightning_dprobust.callbacks.run.SaveConfigOnce`); ``fit`` ends with one summary line
    (epsilon, delta, accountant, steps, best validation metric). A W&B logger runs offline and quietly unless the
    environment sets ``WANDB_MODE`` / ``WANDB_SILENT``.

    Args:
        args: the command line (``None``: ``sys.argv``).
        run: run the subcommand; ``False`` only instantiates the trainer, model and data.
    """

    default_config_files: tuple[Path, ...] = (BASE_CONFIG,)
    """Configs read before the command line's, in order; a later config overrides what it names."""

    def __init__(self, args: Sequence[str] | None = None, run: bool = True) -> None:
        os.environ.setdefault("WANDB_MODE", "offline")  # as for the evaluation subcommands: WANDB_MODE decides
        os.environ.setdefault("WANDB_SILENT", "true")
        super().__init__(
            L.LightningModule,
            L.LightningDataModule,
            subclass_mode_model=True,
            subclass_mode_data=True,
            args=None if args is None else list(args),
            run=run,
            save_config_callback=SaveConfigOnce,
            trainer_defaults={"plugins": [{"class_path": "lightning_dprobust.checkpoint_io.AtomicCheckpointIO"}]},
            auto_configure_optimizers=False,
            parser_kwargs=self._parser_kwargs(run),
        )

    def _parser_kwargs(self, run: bool) -> dict[str, Any]:
        """:attr:`default_config_files` for each subcommand's parser (``run``), else for the one parser of a recipe."""
        defaults = {"default_config_files": [str(path) for path in self.default_config_files]}
        return {name: defaults for name in self.subcommands()} if run else defaults

    @staticmethod
    def subcommands() -> dict[str, set[str]]:
        """``fit``, ``validate`` and ``test``: ``predict`` is not offered (classifiers here define no predict step)."""
        return {name: keys for name, keys in LightningCLI.subcommands().items() if name != "predict"}

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        parser.add_lightning_class_args(DPCallback, "dp", subclass_mode=True, required=False)
        for attribute in ("num_classes", "input_shape", "mean", "std"):
            parser.link_arguments(f"data.{attribute}", f"model.init_args.{attribute}", apply_on="instantiate")

    def _instantiate_trainer(self, config: dict[str, Any], callbacks: list[Any]) -> L.Trainer:
        """Add the ``dp`` group's callback (absent: no DP) and the summary's metric tracker; refuse a
        ``DPCallback`` listed in ``trainer.callbacks`` (it would be a second one, or bypass the group)."""
        callbacks = [callback for callback in callbacks if callback is not None]
        listed = config.get("callbacks") or []
        listed = listed if isinstance(listed, list) else [listed]
        if any(isinstance(callback, DPCallback) for callback in listed):
            raise MisconfigurationException(
                "DPCallback belongs in the `dp` group, not in trainer.callbacks: write `dp: {target_epsilon: 3.0, ...}`"
                " in the config or pass --dp.target_epsilon 3.0"
            )
        return super()._instantiate_trainer(config, [*callbacks, TrainingGuard(), BestValidation(), LedgerLogger()])

    def _parse_ckpt_path(self) -> None:
        """Read ``--ckpt_path`` safely first: a truncated or unsafe file is one ``CheckpointError`` (exit 2)."""
        subcommand = self.config.get("subcommand")
        ckpt_path = self.config[subcommand].get("ckpt_path") if subcommand else None
        if ckpt_path and ckpt_path not in ("last", "best", "hpc", "registry"):
            read_checkpoint(ckpt_path)
        super()._parse_ckpt_path()

    def before_instantiate_classes(self) -> None:
        """A resumed fit (``--ckpt_path``) continues the W&B run whose id is stored in its run folder."""
        if self.subcommand == "fit" and self.config.fit.get("ckpt_path"):
            resume_wandb_run(self.config.fit)

    def before_fit(self) -> None:
        """Refuse, before W&B starts a run, a fit into another run's folder and a ``last`` checkpoint that is not
        there."""
        refuse_used_folder(self.trainer, self.config.fit.get("ckpt_path"))
        if self.config.fit.get("ckpt_path") == "last":
            require_last_checkpoint(self.trainer)

    def after_fit(self) -> None:
        report_fit(self.trainer, find_dp_callback(self.trainer))


@dataclass
class FittedRecipe:
    """What a fitted recipe produced: the trainer, module and data, its DP callback (if any) and test metrics."""

    trainer: L.Trainer
    module: ClassifierModule
    datamodule: ImageDataModule
    privacy: DPCallback | None
    test: dict[str, float] = field(default_factory=dict)


def build_recipe(config: str | Path | dict[str, Any], overrides: Sequence[str] = ()) -> DProbustCLI:
    """Parse and instantiate a recipe (a YAML path or a config dict) plus ``--key=value`` overrides, without fitting."""
    with tempfile.TemporaryDirectory() as scratch:
        if isinstance(config, dict):
            path = Path(scratch) / "recipe.yaml"
            path.write_text(yaml.safe_dump(config, sort_keys=False))
            config = path
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=_EXPECTED_WARNINGS)
            return DProbustCLI(args=["--config", str(config), *overrides], run=False)


def fit_recipe(config: str | Path | dict[str, Any], overrides: Sequence[str] = (), test: bool = True) -> FittedRecipe:
    """Fit a recipe and, with ``test=True``, evaluate it on the data module's test split."""
    cli = build_recipe(config, overrides)
    cli.trainer.fit(cli.model, cli.datamodule)
    metrics = cli.trainer.test(cli.model, cli.datamodule, verbose=False)[0] if test else {}
    return FittedRecipe(cli.trainer, cli.model, cli.datamodule, find_dp_callback(cli.trainer), metrics)


def composed_config(path: str | Path) -> dict[str, Any]:
    """A recipe as ``dprobust fit`` reads it, as a dict: :data:`BASE_CONFIG` with the recipe over it (a mapping is
    merged key by key unless it names another ``class_path``; any other value, a list included, is replaced; a
    ``key+`` list is appended to ``key``'s)."""
    return _merged(yaml.safe_load(BASE_CONFIG.read_text()), yaml.safe_load(Path(path).read_text()) or {})


def _merged(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in over.items():
        if key.endswith("+"):
            merged[key[:-1]] = [*(merged.get(key[:-1]) or []), *value]
        elif (
            isinstance(value, dict)
            and isinstance(merged.get(key), dict)
            and value.get("class_path", merged[key].get("class_path")) == merged[key].get("class_path")
        ):
            merged[key] = _merged(merged[key], value)
        else:
            merged[key] = value
    return merged


def find_dp_callback(trainer: L.Trainer) -> DPCallback | None:
    """The trainer's ``DPCallback``, or ``None`` for a non-private run."""
    return next((callback for callback in trainer.callbacks if isinstance(callback, DPCallback)), None)


def quiet_overrides(workdir: str | Path, device: str | torch.device | None = None) -> list[str]:
    """Overrides for a fit run by the library itself: no logger, bar or summary, files under ``workdir``; with
    ``device``, one device of its type (else the config's accelerator)."""
    quiet = [
        "--trainer.logger=false",
        f"--trainer.default_root_dir={workdir}",
        "--trainer.enable_progress_bar=false",
        "--trainer.enable_model_summary=false",
    ]
    if device is None:
        return quiet
    return [
        *quiet,
        f"--trainer.accelerator={'gpu' if torch.device(device).type == 'cuda' else 'cpu'}",
        "--trainer.devices=1",
    ]


_KEEP = object()


@dataclass(frozen=True)
class Recipe:
    """A ``dprobust fit`` config (the parsed YAML), to adjust and fit from Python.

    Attributes:
        config: the config as a dict (``model``, ``data``, optional ``dp``, ``trainer``, ``seed_everything``).
        source: where it came from, for messages.
    """

    config: dict[str, Any]
    source: str = "recipe"

    @property
    def dp(self) -> dict[str, Any] | None:
        """The ``dp`` group's arguments (``init_args`` when written with a ``class_path``), ``None`` without DP."""
        dp = self.config.get("dp")
        return None if dp is None else dict(dp.get("init_args", dp) if "class_path" in dp else dp)

    @property
    def max_epochs(self) -> int:
        return int((self.config.get("trainer") or {}).get("max_epochs") or 1000)

    @property
    def seed(self) -> int:
        return int(self.config.get("seed_everything") or 0)

    def replace(self, *, dp: Any = _KEEP, max_epochs: int | None = None, batch_size: int | None = None,
                seed: int | None = None) -> Recipe:  # fmt: skip
        """A copy with the ``dp`` group (``None``: no DP), epochs, train batch size or seed replaced."""
        config = copy.deepcopy(self.config)
        if dp is not _KEEP:
            config["dp"] = None if dp is None else dict(dp)
        if max_epochs is not None:
            config.setdefault("trainer", {})["max_epochs"] = int(max_epochs)
        if batch_size is not None:
            config["data"].setdefault("init_args", {})["batch_size"] = int(batch_size)
        if seed is not None:
            config["seed_everything"] = int(seed)
        return Recipe(config, self.source)

    @classmethod
    def from_module(cls, module: ClassifierModule, datamodule: ImageDataModule, batch_size: int, max_epochs: int):
        """The non-private recipe of a trained module: its class and every hyperparameter but the data's (the method's
        own, such as residual perturbation's noise and ensemble size, included)."""
        data_attributes = ("num_classes", "input_shape", "mean", "std", "pretrained")
        return cls(
            {
                "seed_everything": 0,
                "trainer": {"max_epochs": int(max_epochs)},
                "model": {"class_path": _class_path(module), "init_args": {k: v for k, v in module.hparams.items()
                                                                           if k not in data_attributes
                                                                           and not k.startswith("_")}},
                "data": {"class_path": _class_path(datamodule), "init_args": {"batch_size": int(batch_size)}},
            },
            f"the hyperparameters of {type(module).__name__}",
        )  # fmt: skip


def _class_path(instance: object) -> str:
    return f"{type(instance).__module__}.{type(instance).__qualname__}"


def load_recipe(path: str | Path) -> tuple[Recipe, ImageDataModule]:
    """The recipe of a ``dprobust fit`` config file and its data module (parsed as ``dprobust fit`` would).

    Raises:
        FileNotFoundError: the file does not exist.
        ValueError: it is not a mapping with ``model`` and ``data`` sections.
    """
    if not Path(path).is_file():
        raise FileNotFoundError(f"config {path} does not exist: pass e.g. configs/dpsgd/digits.yaml")
    return recipe_from_config(yaml.safe_load(Path(path).read_text()) or {}, str(path))


def recipe_from_config(config: dict[str, Any], source: str) -> tuple[Recipe, ImageDataModule]:
    """The recipe of a parsed config and its data module (the config is validated by :class:`DProbustCLI`)."""
    if not isinstance(config, dict) or not {"model", "data"} <= config.keys():
        raise ValueError(f"{source} needs model and data sections with class_path (and init_args)")
    recipe = Recipe(copy.deepcopy(config), source)
    with tempfile.TemporaryDirectory() as scratch, _quietly():
        datamodule = build_recipe(recipe.config, quiet_overrides(scratch)).datamodule
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


def fit_on_dataset(
    recipe: Recipe,
    dataset: Dataset,
    device: str | torch.device = "cpu",
    module_class: Callable[[type[ClassifierModule]], type[ClassifierModule]] | None = None,
) -> FittedRecipe:
    """Fit ``recipe`` (model, ``dp`` group, callbacks, optimizer, epochs, seed) with ``dataset`` as its train split.

    ``module_class`` maps the recipe's module class to the class actually trained (built with the same arguments),
    e.g. a subclass that adds audit canaries.

    The same path as ``dprobust fit``; the recipe's data module supplies only the dataset attributes the model needs
    (classes, input shape, normalization) and the batch size. No validation, logger or kept checkpoint. The global
    torch random state is restored afterwards, so training does not disturb the caller's randomness.
    """
    with tempfile.TemporaryDirectory(prefix="dprobust-fit-") as workdir, _quietly():
        cli = build_recipe(recipe.config, [*quiet_overrides(workdir, device), "--trainer.num_sanity_val_steps=0"])
        data = _DatasetModule(dataset, cli.datamodule.batch_size, recipe.seed)
        module = cli.model
        if module_class is not None:
            arguments = {key: value for key, value in module.hparams.items() if not key.startswith("_")}
            module = module_class(type(module))(**arguments)
        cli.trainer.fit(module, data)
    return FittedRecipe(cli.trainer, module.eval(), cli.datamodule, find_dp_callback(cli.trainer))


@contextlib.contextmanager
def _quietly() -> Iterator[None]:
    """Restore the global torch random state afterwards; silence Lightning's per-fit info lines and the warnings
    every library-run fit would repeat."""
    logger = logging.getLogger("lightning.pytorch")
    level = logger.level
    logger.setLevel(logging.WARNING)
    try:
        with torch.random.fork_rng(devices=[]), warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=_EXPECTED_WARNINGS)
            yield
    finally:
        logger.setLevel(level)
