"""A callback for crash tests, usable from a ``dprobust fit`` config as ``tests.crash_helpers.StepRecorder``."""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from typing import Any

import lightning as L


def batch_fingerprint(batch: Any) -> str:
    """A short hash of a batch's labels and pixel sum: equal Poisson masks give equal fingerprints."""
    x, y = batch
    digest = hashlib.sha256(y.cpu().numpy().tobytes() + repr(round(float(x.sum()), 3)).encode())
    return digest.hexdigest()[:12]


class StepRecorder(L.Callback):
    """Appends ``{"step": global_step, "batch": fingerprint}`` for each training batch to ``log_path`` (JSON lines).

    With ``pause_at_step``, once the optimizer step that brings ``global_step`` to that value is done, it writes
    ``<log_path>.paused`` and sleeps, so a test can kill the process at a known point between two checkpoints.
    """

    def __init__(self, log_path: str, pause_at_step: int | None = None) -> None:
        self.log_path = Path(log_path)
        self.pause_at_step = pause_at_step

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, *args: Any) -> None:
        with self.log_path.open("a") as log:
            log.write(json.dumps({"step": trainer.global_step, "batch": batch_fingerprint(batch)}) + "\n")

    def on_train_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
        if trainer.global_step == self.pause_at_step:
            Path(f"{self.log_path}.paused").write_text(str(trainer.global_step))
            time.sleep(3600)


def read_steps(log_path: Path) -> dict[int, str]:
    """The fingerprints logged by :class:`StepRecorder`, by global step (a later line for a step wins)."""
    return {row["step"]: row["batch"] for row in map(json.loads, log_path.read_text().splitlines())}
