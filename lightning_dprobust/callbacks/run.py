"""What ``dprobust fit`` keeps in its run folder and reports: the config written once, the run's DP and data
parameters in the logger, and the best validation metric for the end-of-fit summary line."""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.cli import SaveConfigCallback
from lightning.pytorch.utilities.exceptions import MisconfigurationException

from lightning_dprobust.callbacks.dp_randomness import SEEDED_LABEL, DPRandomness
from lightning_dprobust.core.accounting import LedgerOwner, PrivacyLedger, epsilon_for

VALIDATION_METRIC = "val/acc"
"""The validation metric the end-of-fit summary reports the best value of."""


def config_path(trainer: L.Trainer, filename: str = "config.yaml") -> str:
    """Where ``dprobust fit`` writes its config: the run folder (the logger's ``save_dir``, else the root dir)."""
    return os.path.join(trainer.log_dir or trainer.default_root_dir, filename)


def refuse_used_folder(trainer: L.Trainer, ckpt_path: str | None, filename: str = "config.yaml") -> None:
    """A new fit into a folder that holds another run's config would mix their files: refused, unless resuming."""
    path = config_path(trainer, filename)
    exists = trainer.strategy.broadcast(os.path.isfile(path) if trainer.is_global_zero else False)
    if exists and not ckpt_path:
        raise MisconfigurationException(
            f"{path} already exists: this folder holds another run. Resume it with --ckpt_path last, or write "
            "this run elsewhere with --trainer.default_root_dir (and the logger's save_dir)"
        )


class SaveConfigOnce(SaveConfigCallback):
    """Writes ``config.yaml`` into the run folder once training starts, and never over another run's.

    A fit into a folder that already holds a ``config.yaml`` is refused at setup (before anything is written), unless
    it resumes that run (``--ckpt_path``), which keeps the original file. ``validate``/``test`` write nothing. The
    logger (W&B) receives the ``dp``, ``data`` and ``seed_everything`` groups and the DP parameters resolved at setup
    (noise multiplier, sample rate, ...); a W&B logger's run id is stored next to its files (:data:`RUN_ID_FILE`).
    """

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage == "fit":
            refuse_used_folder(trainer, self.config.get("ckpt_path"), self.config_filename)
            self.already_saved = os.path.isfile(config_path(trainer, self.config_filename))

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not self.already_saved:
            super().setup(trainer, pl_module, "fit")
        elif trainer.is_global_zero:  # a resume keeps the folder's config.yaml; its logger run gets the parameters
            self.save_config(trainer, pl_module, "fit")

    def save_config(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        dp = next((callback for callback in trainer.callbacks if isinstance(callback, LedgerOwner)), None)
        params = logged_parameters(self.config.as_dict(), dp)
        for logger in trainer.loggers:
            logger.log_hyperparams(params)
        record_wandb_run_id(trainer)


def logged_parameters(config: dict[str, Any], dp: Any | None) -> dict[str, Any]:
    """What the logger receives: the config's ``dp``, ``data`` and ``seed_everything`` groups and, with a set-up
    ``DPCallback`` ``dp``, its :func:`privacy_parameters`. A seeded ``dp`` group's ``seed`` is logged with
    :data:`~lightning_dprobust.core.sampling.SEEDED_LABEL` after it, never as a harmless number."""
    params = {key: config.get(key) for key in ("dp", "data", "seed_everything")}
    init_args = (params["dp"] or {}).get("init_args") or {}
    if init_args.get("seed") is not None:
        labelled = {**init_args, "seed": f"{init_args['seed']} ({SEEDED_LABEL})"}
        params["dp"] = {**params["dp"], "init_args": labelled}
    if dp is not None:
        params["privacy"] = privacy_parameters(dp)
    return params


def privacy_parameters(dp: Any) -> dict[str, Any]:
    """A set-up ``DPCallback``'s parameters: clip, noise multiplier, delta, target, accountant, sample rate, and its
    randomness (:attr:`~lightning_dprobust.callbacks.dp_randomness.DPRandomness.label`: secret, or a seeded run's
    warning that its guarantee does not hold against whoever holds its config)."""
    return {
        "max_grad_norm": dp.max_grad_norm,
        "noise_multiplier": dp.noise_multiplier,
        "delta": dp.delta,
        "target_epsilon": dp.target_epsilon,
        "accountant": dp.accountant,
        "sample_rate": dp.loaders.sample_rate,
        "clipping": dp.clipping,
        "randomness_mode": dp.randomness.label,
    }


class BestValidation(Callback):
    """Remembers the best :data:`VALIDATION_METRIC` seen at the end of a validation epoch (sanity checks excluded)."""

    def __init__(self) -> None:
        self.best: float | None = None
        self.epoch: int | None = None

    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        value = trainer.callback_metrics.get(VALIDATION_METRIC)
        if trainer.sanity_checking or value is None or not math.isfinite(float(value)):
            return
        if self.best is None or float(value) > self.best:
            self.best, self.epoch = float(value), trainer.current_epoch

    def state_dict(self) -> dict[str, Any]:
        return {"best": self.best, "epoch": self.epoch}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.best, self.epoch = state_dict.get("best"), state_dict.get("epoch")


@dataclass(frozen=True)
class ModuleLedger:
    """A LightningModule's own ledger with the delta and accountant it is read at (the ``DPCallback`` interface)."""

    ledger: PrivacyLedger
    delta: float
    accountant: str

    def epsilon(self) -> float:
        return self.ledger.epsilon(self.delta, self.accountant)


def privacy_owner(trainer: L.Trainer, dp: Any | None = None) -> Any | None:
    """What reports the run's privacy: the DP callback, else the LightningModule when it is a
    :class:`~lightning_dprobust.core.accounting.LedgerOwner`.

    A module ledger counts when it composes a guarantee (Gaussian steps or Laplace releases; nominal claims alone are
    no DP guarantee). It is read at the module's ``privacy_delta`` (``None``: 0, pure DP) with its
    ``privacy_accountant``. Returns ``None`` for a non-private run.
    """
    if dp is not None:
        return dp
    module = trainer.lightning_module
    if not isinstance(module, LedgerOwner) or not (module.ledger.steps or module.ledger.laplace):
        return None
    return ModuleLedger(module.ledger, float(module.privacy_delta or 0.0), module.privacy_accountant)


class LedgerLogger(Callback):
    """Logs ``privacy/epsilon`` of a module-owned ledger (:func:`privacy_owner`) at each train and test epoch end,
    as ``DPCallback`` does for its own; silent when a ``DPCallback`` is present or the run is not private."""

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._log(trainer, pl_module)

    def on_test_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._log(trainer, pl_module)

    @staticmethod
    def _log(trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        owner = privacy_owner(trainer)
        if isinstance(owner, ModuleLedger) and not any(isinstance(c, LedgerOwner) for c in trainer.callbacks):
            pl_module.log("privacy/epsilon", owner.epsilon(), rank_zero_only=True)


def randomness_label(trainer: L.Trainer, dp: Any | None) -> str | None:
    """The label of the run's DP randomness (:attr:`~lightning_dprobust.callbacks.dp_randomness.DPRandomness.label`):
    the DP callback's, else the module's own (generative modules, StoBatch); ``None`` when neither has one."""
    randomness = getattr(dp if dp is not None else trainer.lightning_module, "randomness", None)
    return randomness.label if isinstance(randomness, DPRandomness) else None


def fit_summary(trainer: L.Trainer, dp: Any | None) -> str:
    """One line: epsilon, delta, accountant and steps (or ``no DP``) and the best validation metric; ``dp`` is the
    DP callback or ``None`` (then a module-owned ledger is reported, see :func:`privacy_owner`). A module whose own
    ``ledger`` holds nominal claims only (residual perturbation) is reported as ``no DP guarantee; nominal epsilon X
    at delta D (source)``, never with a DP epsilon. A seeded run's epsilon is followed by
    :data:`~lightning_dprobust.core.sampling.SEEDED_LABEL`."""
    owner = privacy_owner(trainer, dp)
    if owner is None:
        module = trainer.lightning_module
        nominal = module.ledger.nominal_summary() if isinstance(module, LedgerOwner) else None
        privacy = nominal or "no DP (epsilon = inf)"
    elif not owner.ledger.steps:
        privacy = f"epsilon {owner.epsilon():.4g}, pure DP (delta 0: {len(owner.ledger.laplace)} Laplace releases)"
    else:
        privacy = (
            f"epsilon {owner.epsilon():.4g} at delta {owner.delta:.3g} ({owner.accountant} accountant), "
            f"{owner.ledger.steps} steps"
        )
    if owner is not None and randomness_label(trainer, dp) == SEEDED_LABEL:
        privacy += f", {SEEDED_LABEL}"
    best = next((callback for callback in trainer.callbacks if isinstance(callback, BestValidation)), None)
    if best is None or best.best is None:
        validation = f"no {VALIDATION_METRIC} logged"
    else:
        validation = f"best {VALIDATION_METRIC} {best.best:.4f} (epoch {best.epoch})"
    return f"fit done: {privacy}; {validation}"


def report_fit(trainer: L.Trainer, dp: Any | None) -> None:
    """Print :func:`fit_summary` on rank zero; with DP, put the final epsilon and the randomness
    (:func:`randomness_label`, when known) in the W&B run's summary and, when there are Gaussian steps, write the
    privacy curve (``privacy_curve.png`` in the run folder) into its images."""
    if not trainer.is_global_zero:
        return
    print(fit_summary(trainer, dp), flush=True)
    owner = privacy_owner(trainer, dp)
    if owner is None or not (owner.ledger.steps or owner.ledger.laplace):
        return
    png = None
    if owner.ledger.steps:
        curve = privacy_curve(owner.ledger.history, owner.delta, owner.accountant)
        title = f"{owner.accountant}, delta {owner.delta:g}"
        png = plot_privacy_curve(curve, config_path(trainer, "privacy_curve.png"), title)
    for logger in trainer.loggers:
        summary = getattr(getattr(logger, "experiment", None), "summary", None)
        if type(logger).__name__ == "WandbLogger" and summary is not None:
            summary["privacy/final_epsilon"] = float(owner.epsilon())
            summary["privacy/delta"] = float(owner.delta)
            summary["privacy/steps"] = int(owner.ledger.steps)
            if randomness_label(trainer, dp) is not None:
                summary["privacy/randomness_mode"] = randomness_label(trainer, dp)
            if png is not None:
                logger.log_image(key="privacy/epsilon_curve", images=[png])


def privacy_curve(history: Sequence[Any], delta: float, accountant: str, points: int = 20) -> list[tuple[int, float]]:
    """``(steps, epsilon)`` after ``points`` evenly spaced prefixes of a ledger history; the last is the whole run."""
    total = sum(event.steps for event in history)
    marks = sorted({max(1, round(total * k / points)) for k in range(1, points + 1)})
    return [(steps, epsilon_for(_prefix(history, steps), delta, accountant)) for steps in marks]


def _prefix(history: Sequence[Any], steps: int) -> list[tuple[float, float, int]]:
    """The first ``steps`` steps of a history of ``(noise_multiplier, sample_rate, steps)`` events."""
    prefix, left = [], steps
    for event in history:
        if left <= 0:
            break
        prefix.append((event.noise_multiplier, event.sample_rate, min(event.steps, left)))
        left -= event.steps
    return prefix


def plot_privacy_curve(curve: Sequence[tuple[int, float]], path: str, title: str) -> str:
    """Epsilon against training steps, to a PNG (Agg canvas, no pyplot state); returns the path."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(5, 3.5), dpi=120)
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    axes.plot([steps for steps, _ in curve], [epsilon for _, epsilon in curve], marker=".")
    axes.set(xlabel="training steps", ylabel="epsilon", title=title)
    axes.grid(alpha=0.3)
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    figure.savefig(path, format="png", bbox_inches="tight")
    return path


RUN_ID_FILE = "wandb_run_id"
"""File in a W&B logger's ``save_dir`` holding the id of the run that folder belongs to."""


def record_wandb_run_id(trainer: L.Trainer) -> None:
    """Store each W&B logger's run id in its ``save_dir``, so a resume of this folder continues the same run."""
    for logger in trainer.loggers:
        if type(logger).__name__ == "WandbLogger" and logger.save_dir:
            os.makedirs(logger.save_dir, exist_ok=True)
            with open(os.path.join(logger.save_dir, RUN_ID_FILE), "w") as stream:
                stream.write(f"{logger.version}\n")


def resume_wandb_run(config: Any) -> None:
    """On a resume, point the config's W&B logger at the run id stored in its ``save_dir`` (if no id is given)."""
    trainer = config.get("trainer") or {}
    logger = trainer.get("logger")
    if (
        logger is None
        or isinstance(logger, bool | list)
        or not str(logger.get("class_path", "")).endswith("WandbLogger")
    ):
        return
    init_args = logger.get("init_args")
    save_dir = init_args.get("save_dir") or trainer.get("default_root_dir") or "."
    path = os.path.join(save_dir, RUN_ID_FILE)
    if init_args.get("id") is None and os.path.isfile(path):
        with open(path) as stream:
            init_args["id"] = stream.read().strip()


def require_last_checkpoint(trainer: L.Trainer) -> None:
    """``--ckpt_path last`` must find a ``last.ckpt`` in the run folder: resuming nothing would retrain from scratch."""
    found = [
        path
        for callback in trainer.checkpoint_callbacks
        if isinstance(callback, ModelCheckpoint)
        for path in callback._find_last_checkpoints(trainer)
    ]
    if not found:
        raise FileNotFoundError(
            f"--ckpt_path last: no last checkpoint in the run folder {trainer.log_dir or trainer.default_root_dir} "
            "(ModelCheckpoint needs save_last: true); pass the path of a .ckpt, or leave --ckpt_path out to start anew"
        )


class DataProvenance(Callback):
    """Records the training set's size in every checkpoint (``dprobust_data``) and refuses to resume a fit on a
    training set of another size: the DP ledger's sample rate, the epoch length and the learning-rate schedule of
    the saved run all assume the old size. Checkpoints written before this record existed are not checked."""

    KEY = "dprobust_data"

    @staticmethod
    def train_size(trainer: L.Trainer) -> int | None:
        train_set = getattr(trainer.datamodule, "train_set", None) if trainer.datamodule is not None else None
        try:
            return None if train_set is None else len(train_set)
        except TypeError:  # an iterable dataset
            return None

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]) -> None:
        size = self.train_size(trainer)
        if size is not None:
            checkpoint[self.KEY] = {"train_size": size}

    def on_load_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]) -> None:
        saved = (checkpoint.get(self.KEY) or {}).get("train_size")
        size = self.train_size(trainer)
        if trainer.state.fn == "fit" and saved is not None and size is not None and saved != size:
            raise MisconfigurationException(
                f"the checkpoint to resume was trained on {saved} training examples but this run's data has {size}: "
                "a resumed run keeps its data (its sample rate, epoch length and privacy ledger assume it); resume "
                "with the original data settings, or start a new run without --ckpt_path"
            )
