"""Setup checks of ``DPCallback``: every configuration that would silently break the DP guarantee is refused."""

from __future__ import annotations

import lightning as L
import torch
from lightning.pytorch.core.optimizer import _configure_optimizers
from lightning.pytorch.utilities.exceptions import MisconfigurationException

from lightning_dprobust.models import dp_incompatibilities


def check_module(pl_module: L.LightningModule) -> None:
    """The module must expose a per-example loss and the private-step seam, and mix no examples."""
    if not (hasattr(pl_module, "per_example_loss") and hasattr(pl_module, "private_step")):
        raise MisconfigurationException(
            f"DPCallback needs a module with `per_example_loss` and `private_step` (got {type(pl_module).__name__}): "
            "subclass lightning_dprobust.methods.ClassifierModule"
        )
    if not pl_module.automatic_optimization:
        raise MisconfigurationException(
            "DPCallback drives the optimizer step through automatic optimization; manual optimization would bypass "
            "the private gradient: remove `self.automatic_optimization = False`"
        )
    problems = dp_incompatibilities(pl_module)
    if problems:
        listed = "\n  ".join(problems)
        raise MisconfigurationException(
            "DPCallback refuses a model with layers that mix examples or break per-example gradients:\n  "
            f"{listed}\nFix: lightning_dprobust.models.make_dp_compatible(model) (BatchNorm -> GroupNorm)"
        )


def check_accumulation(trainer: L.Trainer) -> None:
    """No gradient accumulation (checked at setup and at every step: a scheduler may change it during fit)."""
    if trainer.accumulate_grad_batches != 1:
        raise MisconfigurationException(
            f"DPCallback: Trainer(accumulate_grad_batches={trainer.accumulate_grad_batches}) (or a "
            "GradientAccumulationScheduler) changes the sampled batch the accountant assumes; set "
            "accumulate_grad_batches=1, remove the scheduler, and use DPCallback(max_physical_batch_size=...) to "
            "bound memory instead"
        )


def check_trainer(trainer: L.Trainer, poisson_sampling: bool) -> None:
    """No accumulation, no fp16 or half-precision parameters, no Lightning clipping, no distributed sampler."""
    check_accumulation(trainer)
    precision = str(trainer.precision)
    if precision.startswith("16") or precision == "bf16-true":
        raise MisconfigurationException(
            f"DPCallback: Trainer(precision={trainer.precision!r}) breaks per-example clipping (fp16 scales the "
            "loss; half-precision parameters round the clipped gradients above max_grad_norm); use "
            "precision='32-true' or 'bf16-mixed'"
        )
    if trainer.gradient_clip_val:
        raise MisconfigurationException(
            f"DPCallback: Trainer(gradient_clip_val={trainer.gradient_clip_val}) clips the non-private batch "
            "gradient; remove it: DPCallback(max_grad_norm=...) clips each example"
        )
    connector = trainer._accelerator_connector
    if poisson_sampling and connector.is_distributed and connector.use_distributed_sampler:
        raise MisconfigurationException(
            "DPCallback: under DDP the callback shards its own Poisson batches; set "
            "Trainer(use_distributed_sampler=False)"
        )


def check_optimizer(trainer: L.Trainer) -> torch.optim.Optimizer:
    """The one optimizer, if it evaluates its closure once per step: ``LBFGS`` re-evaluates the loss several times per
    step, each a private release on the same sampled batch (refused here; any other optimizer that does so is stopped
    at its second call by :func:`~lightning_dprobust.callbacks.dp_guard.guard_optimizer_step`)."""
    (optimizer,) = trainer.optimizers
    if isinstance(optimizer, torch.optim.LBFGS):
        raise MisconfigurationException(
            "DPCallback: torch.optim.LBFGS evaluates the loss several times per step, and each evaluation would be a "
            "private release on the same sampled batch; use an optimizer that evaluates it once (SGD, Adam, AdamW)"
        )
    return optimizer


def guard_single_optimizer(pl_module: L.LightningModule) -> None:
    """Wrap ``configure_optimizers`` so that more than one optimizer is refused with a DP-specific message.

    The check must run inside ``configure_optimizers``: Lightning rejects several optimizers under automatic
    optimization right after calling it, with a message that does not say why DP needs one.
    """
    original = type(pl_module).configure_optimizers.__get__(pl_module)

    def configure_optimizers():
        config = original()
        optimizers, _, _ = _configure_optimizers(config)
        if len(optimizers) != 1:
            raise MisconfigurationException(
                f"DPCallback supports exactly one optimizer, the module configured {len(optimizers)}: one noisy "
                "gradient is released per step; return a single optimizer from configure_optimizers"
            )
        return config

    pl_module.configure_optimizers = configure_optimizers


def release_optimizer_guard(pl_module: L.LightningModule) -> None:
    vars(pl_module).pop("configure_optimizers", None)
