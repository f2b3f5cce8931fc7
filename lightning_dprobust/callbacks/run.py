"""What ``dprobust fit`` keeps in its run folder and reports: the config written once, the run's DP and data
parameters in the logger, and the best validation metric for the end-of-fit summary line."""

from __future__ import annotations

import math
import os
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.cli import SaveConfigCallback
from lightning.pytorch.utilities.exceptions import MisconfigurationException

VALIDATION_METRIC = "val/acc"
"""The validation metric the end-of-fit summary reports the best value of."""


class SaveConfigOnce(SaveConfigCallback):
    """Writes ``config.yaml`` into the run folder once training starts, and never over another run's.

    A fit into a folder that already holds a ``config.yaml`` is refused at setup (before anything is written), unless
    it resumes that run (``--ckpt_path``), which keeps the original file. ``validate``/``test`` write nothing. The
    logger (W&B) receives the ``dp``, ``data`` and ``seed_everything`` groups and the DP parameters resolved at setup
    (noise multiplier, sample rate, ...).
    """

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        path = os.path.join(trainer.log_dir or trainer.default_root_dir, self.config_filename)
        exists = trainer.strategy.broadcast(os.path.isfile(path) if trainer.is_global_zero else False)
        if exists and not self.config.get("ckpt_path"):
            raise MisconfigurationException(
                f"{path} already exists: this folder holds another run. Resume it with --ckpt_path last, or write "
                "this run elsewhere with --trainer.default_root_dir (and the logger's save_dir)"
            )
        self.already_saved = exists

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.overwrite = False
        super().setup(trainer, pl_module, "fit")

    def save_config(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        config = self.config.as_dict()
        params = {key: config.get(key) for key in ("dp", "data", "seed_everything")}
        dp = next((callback for callback in trainer.callbacks if hasattr(callback, "ledger")), None)
        if dp is not None:
            params["privacy"] = privacy_parameters(dp)
        for logger in trainer.loggers:
            logger.log_hyperparams(params)


def privacy_parameters(dp: Any) -> dict[str, Any]:
    """A set-up ``DPCallback``'s parameters: clip, noise multiplier, delta, target, accountant, sample rate."""
    return {
        "max_grad_norm": dp.max_grad_norm,
        "noise_multiplier": dp.noise_multiplier,
        "delta": dp.delta,
        "target_epsilon": dp.target_epsilon,
        "accountant": dp.accountant,
        "sample_rate": dp.loaders.sample_rate,
        "clipping": dp.clipping,
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


def fit_summary(trainer: L.Trainer, dp: Any | None) -> str:
    """One line: epsilon, delta, accountant and steps (or ``no DP``) and the best validation metric."""
    if dp is None:
        privacy = "no DP (epsilon = inf)"
    else:
        privacy = (
            f"epsilon {dp.epsilon():.4g} at delta {dp.delta:.3g} ({dp.accountant} accountant), {dp.ledger.steps} steps"
        )
    best = next((callback for callback in trainer.callbacks if isinstance(callback, BestValidation)), None)
    if best is None or best.best is None:
        validation = f"no {VALIDATION_METRIC} logged"
    else:
        validation = f"best {VALIDATION_METRIC} {best.best:.4f} (epoch {best.epoch})"
    return f"fit done: {privacy}; {validation}"


def report_fit(trainer: L.Trainer, dp: Any | None) -> None:
    """Print :func:`fit_summary` on rank zero and put the final epsilon in the W&B run's summary."""
    if not trainer.is_global_zero:
        return
    print(fit_summary(trainer, dp), flush=True)
    if dp is None:
        return
    for logger in trainer.loggers:
        summary = getattr(getattr(logger, "experiment", None), "summary", None)
        if type(logger).__name__ == "WandbLogger" and summary is not None:
            summary["privacy/final_epsilon"] = float(dp.epsilon())
            summary["privacy/delta"] = float(dp.delta)
