"""``TrainingGuard``: stops a fit that cannot produce a usable model, with one clear error instead of a NaN checkpoint
or a run that plans absurdly many steps."""

from __future__ import annotations

from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback


class NonFiniteError(ValueError):
    """Training produced a non-finite loss or non-finite weights."""


class TrainingGuard(Callback):
    """Refuses a DP sampling rate whose expected batch holds less than one example, and stops training at the first
    step whose loss or weights are not finite (before any checkpoint of them is written).

    The checks read only the loss of the step and the parameters after it; they add no randomness and do not touch
    the gradients, so they leave the privacy guarantee as it was.
    """

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        for callback in trainer.callbacks:
            loaders = getattr(callback, "loaders", None)
            rate, examples = getattr(loaders, "sample_rate", None), getattr(loaders, "num_examples", None)
            if rate is not None and examples and rate * examples < 1:
                raise ValueError(
                    f"dp sample_rate={rate:g} on {examples} training examples gives an expected batch of "
                    f"{rate * examples:.3g} examples and about {1 / rate:,.0f} steps per epoch: use a sample_rate of "
                    f"at least {1 / examples:.3g} (or leave it unset to derive it from the batch size)"
                )

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        where = f"epoch {trainer.current_epoch}, step {trainer.global_step}"
        if isinstance(loss, torch.Tensor) and not bool(torch.isfinite(loss.detach()).all()):
            raise NonFiniteError(
                f"training stopped at {where}: the loss is {loss.detach().float().mean().item()}; lower the learning "
                "rate (model.init_args.lr) or check the data for non-finite values"
            )
        bad = non_finite_parameters(pl_module)
        if bad:
            raise NonFiniteError(
                f"training stopped at {where}: non-finite weights in {', '.join(bad[:3])}; lower the learning rate "
                "(model.init_args.lr) or the clipping bound"
            )


def non_finite_parameters(module: torch.nn.Module) -> list[str]:
    """Names of the floating-point parameters and buffers of ``module`` that hold a NaN or an infinity."""
    tensors = [*module.named_parameters(), *module.named_buffers()]
    floating = [(name, tensor) for name, tensor in tensors if tensor.is_floating_point()]
    if not floating:
        return []
    finite = torch.stack([torch.isfinite(tensor.detach()).all() for _, tensor in floating]).cpu()
    return [name for (name, _), ok in zip(floating, finite.tolist(), strict=True) if not ok]


def check_finite(module: torch.nn.Module, what: str) -> None:
    """Raise ``NonFiniteError`` naming ``what`` when ``module`` has a non-finite weight."""
    bad = non_finite_parameters(module)
    if bad:
        raise NonFiniteError(f"{what} has non-finite weights ({', '.join(bad[:3])}): it cannot be evaluated")


def refuse_checkpoint_upload(trainer: L.Trainer, secret: str) -> None:
    """Refuses a logger that uploads the run's checkpoints (W&B ``log_model``) when they hold ``secret``.

    A method whose training checkpoints keep secret training state (StoBatch's Laplace draw, needed to resume) calls
    this at fit start: logs are assumed public (design, contract 8), so a checkpoint uploaded with them would void
    the guarantee for whoever reads the project. The released weights (state dict, zoo files) hold no such state.
    """
    for logger in trainer.loggers:
        upload = getattr(logger, "_log_model", False)
        if upload:
            raise ValueError(
                f"{type(logger).__name__}(log_model={upload!r}) would upload this run's checkpoints, which hold "
                f"{secret}: set trainer.logger.init_args.log_model: false (keep the checkpoints on this machine and "
                "release the weights, which hold no secret)"
            )
