"""Train until converged: a callback that stops a ``dprobust fit`` recipe once its validation accuracy has plateaued
and keeps the weights of its best validation epoch.

:func:`lightning_dprobust.recipes.fit_on_dataset` (the path the membership benchmarks train through) runs no
validation loop, so Lightning's ``EarlyStopping`` has nothing to monitor. :class:`Convergence` evaluates the
validation split of a data module itself at the end of every training epoch (the model in eval mode, one forward
per image: a residual-perturbation network keeps its noise on, as at test time). The criterion:

* it never stops before ``min_epochs`` epochs (a noisy network's early accuracy can stall for a few epochs before it
  climbs);
* from then on it stops once the accuracy has not exceeded the best so far by more than ``min_delta`` for
  ``patience`` epochs in a row; the trainer's ``max_epochs`` is the cap;
* at the end of training it loads the weights (parameters and buffers) of the epoch with the highest validation
  accuracy (the earliest on ties), so the model handed back is the best one seen, not the last.

The module it trained gets ``converged_epochs`` (epochs trained), ``best_epoch`` (the epoch whose weights it holds)
and ``val_history`` (the accuracy after each epoch). ``epochs=N`` instead trains exactly ``N`` epochs and keeps the
last weights (shadow models trained like a target whose kept weights are those of epoch ``N``).

In a recipe::

    trainer:
      max_epochs: 30   # the cap
      callbacks:
        - class_path: convergence.Convergence
          init_args: {data_module: MNIST5kDataModule, data_args: {test_fraction: 0.5}, min_epochs: 10, patience: 3,
                      min_delta: 0.002}
"""

from __future__ import annotations

import copy
import functools
import json
from typing import Any

import lightning as L
import torch
from torch.utils.data import Dataset

import lightning_dprobust.data
from lightning_dprobust.audit.membership import model_outputs


@functools.lru_cache(maxsize=4)
def _validation_split(data_module: str, data_args: str) -> Dataset:
    """The validation split of ``lightning_dprobust.data.<data_module>(seed=0, **data_args)`` (read once)."""
    datamodule = getattr(lightning_dprobust.data, data_module)(**({"seed": 0} | json.loads(data_args)))
    datamodule.setup("fit")
    if datamodule.val_set is None or not len(datamodule.val_set):
        raise ValueError(f"{data_module}({data_args}) has no validation split to monitor convergence on")
    return datamodule.val_set


class Convergence(L.Callback):
    """Stop when validation accuracy has not improved by more than ``min_delta`` for ``patience`` epochs (never before
    ``min_epochs``), then restore the weights of the best validation epoch.

    Args:
        data_module: class name in :mod:`lightning_dprobust.data` whose validation split is monitored (built with
            ``seed=0`` and ``data_args``, the split every benchmark run evaluates on).
        data_args: keyword arguments of that data module.
        patience: epochs without an improvement larger than ``min_delta`` after which training stops.
        min_delta: the smallest accuracy gain (a fraction: 0.002 is 0.2 points) that counts as an improvement.
        min_epochs: training runs at least this many epochs whatever the accuracy does.
        epochs: if given, ignore the accuracy, stop after exactly this many epochs and keep the last weights.
    """

    def __init__(
        self,
        data_module: str = "MNIST5kDataModule",
        data_args: dict[str, Any] | None = None,
        patience: int = 3,
        min_delta: float = 0.002,
        min_epochs: int = 1,
        epochs: int | None = None,
    ) -> None:
        if patience < 1 or min_delta < 0 or min_epochs < 1 or (epochs is not None and epochs < 1):
            raise ValueError(
                f"need patience >= 1, min_delta >= 0, min_epochs >= 1, epochs >= 1; got {patience}, {min_delta}, "
                f"{min_epochs}, {epochs}"
            )
        self.data_module, self.data_args = data_module, json.dumps(dict(data_args or {}), sort_keys=True)
        self.patience, self.min_delta, self.min_epochs, self.epochs = patience, min_delta, min_epochs, epochs
        self.reference, self.wait, self.history = -1.0, 0, []  # reference: the accuracy that improvements count from
        self.best_accuracy, self.best_epoch, self.best_state = -1.0, None, None

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        trained = trainer.current_epoch + 1
        if self.epochs is not None:
            trainer.should_stop = trainer.should_stop or trained >= self.epochs
            self.best_epoch = trained
        else:
            with torch.no_grad():
                logits, labels = model_outputs(pl_module, _validation_split(self.data_module, self.data_args))
            accuracy = float((logits.argmax(1) == labels).float().mean())
            self.history.append(accuracy)
            if accuracy > self.best_accuracy:
                self.best_accuracy, self.best_epoch = accuracy, trained
                self.best_state = copy.deepcopy(pl_module.state_dict())
            if accuracy > self.reference + self.min_delta:
                self.reference, self.wait = accuracy, 0
            else:
                self.wait += 1
            trainer.should_stop = trainer.should_stop or (trained >= self.min_epochs and self.wait >= self.patience)
        pl_module.converged_epochs = trained
        pl_module.best_epoch = self.best_epoch
        pl_module.val_history = list(self.history)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Load the weights of the best validation epoch (nothing to do with ``epochs``: the last ones are kept)."""
        if self.best_state is not None:
            pl_module.load_state_dict(self.best_state)
            pl_module.best_epoch = self.best_epoch
