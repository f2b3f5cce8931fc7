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
    DataProvenance,
    LedgerLogger,
    SaveConfigOnce,
    refuse_used_folder,
    report_fit,
    require_last_checkpoint,
    resume_wandb_run,
)
from lightning_dprobust.checkpoint_io import read_checkpoint
from lightning_dprobust.data.base import ImageDataModule
from lightning_dprobust.methods.base import CLASS_KEY, ClassifierModule
from lightning_dprobust.paths import shipped_root
from lightning_dprobust.robustness.reports import check_wandb_login

CONFIG_DIR = shipped_root() / "configs"
"""The shipped recipes, ``configs/<method>/<dataset>.yaml``."""
BASE_CONFIG = CONFIG_DIR / "base" / "trainer.yaml"
"""The trainer settings every recipe shares (devices, the W&B logger, the checkpoint callback), read before any config
(jsonargparse's ``default_config_files``): a recipe names only what differs."""

_EXPECTED_WARNINGS = ".*(does not have many workers|no `val_dataloader`|LeafSpec|LightningCLI's args parameter).*"
"""Warnings every programmatic fit would repeat: few loader workers, no validation loop, ``args=`` with ``sys.argv``."""


class DuplicateKeyError(ValueError):
    """A YAML mapping (a config file or a flag's value) names one key twice: PyYAML would keep the last silently."""


def _refuse_duplicate_keys(text: str) -> None:
    """Raise :class:`DuplicateKeyError` naming the first key written twice in one mapping of ``text``, and its line."""
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError:
        return  # not YAML: jsonargparse's own loader reports it (or reads the text as a string)
    if isinstance(root, yaml.ScalarNode):
        _refuse_yaml11_boolean(root)
    nodes = [root] if root is not None else []
    while nodes:
        node = nodes.pop()
        if isinstance(node, yaml.MappingNode):
            seen: set[str] = set()
            for key, value in node.value:
                name = key.value if isinstance(key, yaml.ScalarNode) else None
                if name is not None and name in seen:
                    where = f"{key.start_mark.name}, " if key.start_mark.name not in ("<unicode string>", "") else ""
                    raise DuplicateKeyError(
                        f"the YAML key {name!r} appears twice in one mapping ({where}line {key.start_mark.line + 1}): "
                        "YAML would keep only the last value; keep one"
                    )
                seen.add(name)
                if isinstance(value, yaml.ScalarNode):
                    _refuse_yaml11_boolean(value, name)
                nodes += [key, value]
        elif isinstance(node, yaml.SequenceNode):
            nodes += node.value


_YAML11_BOOLEANS = frozenset({"y", "n", "yes", "no", "on", "off"})
"""Words that YAML 1.1 (PyYAML, jsonargparse) reads as booleans when unquoted and that a bool argument also accepts
as strings: ``poisson_sampling: "no"`` and ``poisson_sampling: no`` would both mean ``False``; refused so that a
switch is written ``true`` or ``false``."""


def _refuse_yaml11_boolean(node: yaml.ScalarNode, key: str | None = None) -> None:
    if str(node.value).lower() in _YAML11_BOOLEANS:
        where = f"{key}: " if key is not None else ""
        raise ValueError(
            f"{where}{node.value!r} is ambiguous (YAML 1.1 reads it as a boolean, YAML 1.2 and JSON as a string): "
            "write true or false for a switch"
        )


def _checked_yaml_load(text: str) -> Any:
    """jsonargparse's YAML loader, after refusing duplicated keys."""
    from jsonargparse._loaders_dumpers import yaml_load

    _refuse_duplicate_keys(text)
    return yaml_load(text)


def _install_yaml_loader() -> None:
    """Make jsonargparse (configs and flag values of ``dprobust fit|validate|test``) refuse a duplicated YAML key."""
    from jsonargparse import set_loader

    set_loader("yaml", _checked_yaml_load, exceptions=(yaml.YAMLError,))


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
        _install_yaml_loader()
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
        for key, meaning in WANDB_FLAGS.items():
            parser.add_argument(f"--wandb.{key}", type=str | None, default=None, help=f"W&B {meaning} of the run")
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
        extra = [TrainingGuard(), BestValidation(), LedgerLogger(), DataProvenance()]
        return super()._instantiate_trainer(config, [*callbacks, *extra])

    def _parse_ckpt_path(self) -> None:
        """Check the config as the user wrote it, then read ``--ckpt_path`` safely: a truncated or unsafe file is one
        ``CheckpointError`` (exit 2). A checkpoint of another method than the config's is refused (LightningCLI would
        otherwise swap the config's method for the checkpoint's), and so is a resumed fit whose config changes one
        of the checkpoint's hyperparameters (the optimizer state, ``config.yaml`` and the logger would disagree)."""
        subcommand = self.config.get("subcommand")
        config = self.config[subcommand] if subcommand else self.config
        refuse_linked_overrides(config)
        ckpt_path = config.get("ckpt_path")
        if ckpt_path and ckpt_path not in ("last", "best", "hpc", "registry"):
            checkpoint = read_checkpoint(ckpt_path)
            refuse_non_finite_weights(checkpoint, ckpt_path)
            model = config.get("model")
            if model is not None and model.get("class_path"):
                hparams = _init_args(model)
                check_resumed_module(checkpoint, model["class_path"], hparams, ckpt_path, subcommand == "fit")
        super()._parse_ckpt_path()

    def before_instantiate_classes(self) -> None:
        """``--wandb.project|entity|group`` go to the W&B logger; an online W&B logger without an API key is refused
        in one line; a resumed fit (``--ckpt_path``) continues the W&B run whose id is stored in its run folder."""
        config = self.config[self.subcommand] if self.subcommand else self.config
        apply_wandb_flags(config)
        if self.subcommand == "fit" and self.config.fit.get("ckpt_path"):
            resume_wandb_run(self.config.fit)

    def before_fit(self) -> None:
        """Refuse, before W&B starts a run, a fit into another run's folder and a ``last`` checkpoint that is not
        there, or that another method or other hyperparameters wrote."""
        refuse_used_folder(self.trainer, self.config.fit.get("ckpt_path"))
        if self.config.fit.get("ckpt_path") == "last":
            require_last_checkpoint(self.trainer)
            last = last_checkpoint(self.trainer)
            if last is not None:
                module = self.model
                hparams = {key: value for key, value in module.hparams.items() if not key.startswith("_")}
                check_resumed_module(read_checkpoint(last), _class_path(module), hparams, f"last ({last})", True)

    def after_fit(self) -> None:
        report_fit(self.trainer, find_dp_callback(self.trainer))


WANDB_FLAGS = {"project": "project", "entity": "entity (user or team)", "group": "group"}
"""``--wandb.<key>`` of every ``dprobust`` command that logs: here applied to the config's ``WandbLogger``."""


def _wandb_loggers(config: Any) -> list[Any]:
    trainer = config.get("trainer") if config is not None else None
    loggers = trainer.get("logger") if trainer is not None else None
    loggers = loggers if isinstance(loggers, list) else [loggers]
    return [
        logger
        for logger in loggers
        if logger is not None and not isinstance(logger, bool) and hasattr(logger, "get")
        and str(logger.get("class_path", "")).endswith("WandbLogger")
    ]  # fmt: skip


def apply_wandb_flags(config: Any) -> None:
    """Set the W&B logger's ``project``/``entity``/``group`` from ``--wandb.*``; refuse ``--wandb.*`` without a W&B
    logger, and an online W&B logger without an API key (W&B would stop to ask for one, or fail with a traceback)."""
    wandb = config.get("wandb") if config is not None else None
    given = {key: wandb.get(key) for key in WANDB_FLAGS if wandb is not None and wandb.get(key) is not None}
    loggers = _wandb_loggers(config)
    if given and not loggers:
        flags = ", ".join(f"--wandb.{key}" for key in given)
        raise MisconfigurationException(f"{flags}: this run has no W&B logger (trainer.logger) to apply it to")
    for logger in loggers:
        if logger.get("init_args") is None:
            logger["init_args"] = {}
        init_args = logger["init_args"]
        for key, value in given.items():
            init_args[key] = value
        if not init_args.get("offline"):
            check_wandb_login("--trainer.logger false")


RENAMED_SEEDS = ("noise_seed", "dp_seed")
"""Older spellings of a method's ``seed`` argument, which the method saves under ``seed``."""

LINKED = ("num_classes", "input_shape", "mean", "std")
"""Model arguments that the data module sets (``link_arguments``): a value in the config would be ignored."""


def refuse_linked_overrides(config: Any) -> None:
    """Refuse ``model.init_args.num_classes`` (and ``input_shape``, ``mean``, ``std``) set to anything but the
    class's default: the data module's value replaces it at instantiation, silently."""
    model = config.get("model") if config is not None else None
    if model is None or not model.get("class_path") or model.get("init_args") is None:
        return
    defaults = _signature_defaults(model["class_path"])
    init_args = _init_args(model)
    for key in LINKED:
        if key in init_args and key in defaults and _plain(init_args[key]) != _plain(defaults[key]):
            raise MisconfigurationException(
                f"model.init_args.{key}={_plain(init_args[key])!r} would be ignored: {key} comes from the data module "
                f"(data.init_args); drop it from the model, and choose the data module (or its arguments) instead"
            )


def check_resumed_module(
    checkpoint: dict[str, Any], class_path: str, init_args: dict[str, Any], source: str, resume: bool
) -> None:
    """Refuse a checkpoint written by another method than ``class_path``; with ``resume`` (a fit), also one whose
    hyperparameters differ from ``init_args`` (a changed learning rate would be recorded three different ways)."""
    saved = checkpoint.get("hyper_parameters") or {}
    saved_class = saved.get("_class_path") or str(checkpoint.get(CLASS_KEY) or "").replace(":", ".")
    if saved_class and _resolve(saved_class) != _resolve(class_path):
        raise MisconfigurationException(
            f"--ckpt_path {source} holds a {saved_class.rsplit('.', 1)[-1]} model but the config's method is "
            f"{class_path.rsplit('.', 1)[-1]}: pass the config it was trained with (or a checkpoint of this method)"
        )
    foreign = sorted(key for key in saved if not key.startswith("_") and key not in init_args)
    if foreign and saved_class:
        raise MisconfigurationException(
            f"--ckpt_path {source} holds hyperparameters that {class_path.rsplit('.', 1)[-1]} does not take: "
            f"{foreign}; it was written by another version of the method or edited: pass a checkpoint of this one"
        )
    if not resume:
        return
    init_args = dict(init_args)
    for old_name in RENAMED_SEEDS:  # a deprecated spelling is saved under ``seed``
        if init_args.get(old_name) is not None and init_args.get("seed") is None:
            init_args["seed"] = init_args[old_name]
    changed = [
        f"{key}={_plain(init_args[key])!r} (checkpoint: {_plain(saved[key])!r})"
        for key in init_args
        if key in saved
        and key not in LINKED
        and not key.startswith("_")
        and _plain(init_args[key]) != _plain(saved[key])
    ]
    if changed:
        raise MisconfigurationException(
            f"resuming --ckpt_path {source} with other hyperparameters: {', '.join(changed)}; a resumed run keeps the "
            "ones it was trained with (optimizer state, config.yaml and the logger would disagree): resume with the "
            "original values, or start a new run without --ckpt_path"
        )


def refuse_non_finite_weights(checkpoint: dict[str, Any], source: str) -> None:
    """Refuse a checkpoint whose weights hold NaN or infinity: resuming or evaluating it fails later, less clearly."""
    for name, value in (checkpoint.get("state_dict") or {}).items():
        if isinstance(value, torch.Tensor) and value.is_floating_point() and not bool(torch.isfinite(value).all()):
            raise MisconfigurationException(
                f"--ckpt_path {source} has non-finite weights ({name} holds NaN or infinity): the run diverged before "
                "it was saved; resume from an earlier checkpoint, or start anew with a lower learning rate"
            )


def last_checkpoint(trainer: L.Trainer) -> str | None:
    """The ``last.ckpt`` that ``--ckpt_path last`` resumes, ``None`` if there is none."""
    from lightning.pytorch.callbacks import ModelCheckpoint

    found = [
        path
        for callback in trainer.checkpoint_callbacks
        if isinstance(callback, ModelCheckpoint)
        for path in callback._find_last_checkpoints(trainer)
    ]
    return max(found, key=os.path.getmtime) if found else None


def _init_args(model: Any) -> dict[str, Any]:
    init_args = model.get("init_args") or {}
    return dict(init_args.as_dict() if hasattr(init_args, "as_dict") else init_args)


def _plain(value: Any) -> Any:
    """Tuples as lists and namespaces as dicts, recursively, so that a config value and a saved one compare."""
    if hasattr(value, "as_dict"):
        value = value.as_dict()
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    return value


def _resolve(class_path: str) -> Any:
    """The class ``class_path`` names (``module.Class``), or the path itself when it cannot be imported."""
    import importlib

    module, _, name = class_path.rpartition(".")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError):
        return class_path


def _signature_defaults(class_path: str) -> dict[str, Any]:
    import inspect

    cls = _resolve(class_path)
    try:
        parameters = inspect.signature(cls).parameters
    except (TypeError, ValueError):
        return {}
    return {name: p.default for name, p in parameters.items() if p.default is not inspect.Parameter.empty}


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
    text = Path(path).read_text()
    _refuse_duplicate_keys(text)
    return recipe_from_config(yaml.safe_load(text) or {}, str(path))


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
