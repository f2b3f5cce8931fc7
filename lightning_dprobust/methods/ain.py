"""AIN: distance-constrained Adversarial Imitation Network. Tang, "Deep Learning with Differential Privacy and
Adversarial Robustness", PhD thesis, Emory University 2021, chapter 5 (TDSC 2021)."""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import torch
import torch.nn.functional as F
import torchattacks
from lightning.pytorch.utilities import rank_zero_info
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from torch import Tensor, nn
from torchmetrics import MeanMetric

from lightning_dprobust.core.ain_losses import ain_loss, distance_loss, imitation_loss, misclassification_loss
from lightning_dprobust.core.ain_schedule import BoundController, check_decay
from lightning_dprobust.data.validation import check_batch
from lightning_dprobust.methods.ain_logging import log_examples
from lightning_dprobust.methods.base import ClassifierModule
from lightning_dprobust.methods.transdenoiser import check_classifier_fits, load_public_classifier
from lightning_dprobust.models.ain import AINGenerator
from lightning_dprobust.robustness.ain_attack import CONDITIONS, Condition
from lightning_dprobust.robustness.attacks import attack_guard


class ImitationTargets:
    """i-FGSM examples of the frozen target, computed once per training example and then read back.

    Example ``i``'s target is keyed by the bytes of ``(x_i, y_i)``, so it is found again whatever the batch order or
    composition; i-FGSM (Kurakin et al. 2017, https://arxiv.org/abs/1607.02533) without random start is a function
    of ``x_i``, ``y_i`` and the frozen target alone. ``computed`` counts the examples attacked so far.
    """

    def __init__(self, attack: torchattacks.BIM) -> None:
        self.attack, self.store, self.computed = attack, {}, 0

    def __call__(self, target: nn.Module, x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
        keys = [
            hashlib.sha1(xi.cpu().numpy().tobytes() + yi.cpu().numpy().tobytes()).digest()
            for xi, yi in zip(x, y, strict=True)
        ]
        missing = [i for i, key in enumerate(keys) if key not in self.store]
        if missing:
            self.attack.set_device(x.device)
            with torch.inference_mode(False), attack_guard(target):
                target.eval()
                images = self.attack(x[missing].clone(), y[missing].clone()).detach()
                logits = target(images).detach()
            for j, i in enumerate(missing):
                self.store[keys[i]] = (images[j].cpu(), logits[j].cpu())
            self.computed += len(missing)
        images, logits = zip(*(self.store[key] for key in keys), strict=True)
        return torch.stack(images).to(x.device), torch.stack(logits).to(x.device)


class AIN(ClassifierModule):
    """Trains AIN's generator against a frozen target classifier ``F`` (Eqs 5.1-5.6, Algorithm 2).

    Each training example gets ``x' = clip(x + clip(z, -B, B), 0, 1)`` from
    :class:`~lightning_dprobust.models.AINGenerator` (noise injected in the central state) and the loss
    ``b_d L_d + b_m L_m + b_c L_c`` plus ``b_label`` times the conditional state extractor's cross-entropy. ``L_m``
    imitates i-FGSM examples of ``F`` computed once per example (:class:`ImitationTargets`). After each validation
    epoch the bound follows Algorithm 2 (:class:`~lightning_dprobust.core.ain_schedule.BoundController`): on a
    rollback the generator's weights and the optimizer's state (Adam's moments and step count) of the previous epoch
    are restored; the learning rate keeps its schedule. Training conditions the generator on the true label (the
    thesis's Eq 5.1); validation and test condition it on ``condition`` (default ``F``'s prediction, what an attacker
    without labels has; ``"true_label"``: the label). ``forward(x)`` is ``F`` on AIN's examples of ``x`` conditioned
    on ``F``'s prediction.

    Guarantees:
        ``F`` never trains: ``requires_grad=False``, always in eval mode; the optimizer holds the generator only.
        The bound is the generator's buffer ``bound``, so checkpoints and saved weights carry it; the controller's
        state and the previous epoch's weights and optimizer state are checkpointed too. AIN's training is not
        private (no DP callback is accepted); a classifier trained on AIN's examples can be
        (``AdversarialAugmentation`` under ``DPCallback``).

    Args:
        target: the frozen target: a zoo entry name, ``"timm/<arch>"``, a Lightning ``.ckpt`` of a classifier trained
            with this library, or a module mapping ``[0, 1]`` images to logits (:func:`load_target`).
        target_class: the class of a targeted AIN; ``None``: untargeted.
        generator_kwargs: arguments of :class:`~lightning_dprobust.models.AINGenerator` (``channels``, ...).
        noise_std: std of the injected noise (0: AIN_nr). noise_seed: seed of the training noise (not secret).
        initial_bound: ``B0``. decay: ``"step"``, ``"exp"`` or ``"time"``. decay_rate: ``d``. decay_step_size: ``v``.
        min_bound: the bound never decays below it. adaptive: use Algorithm 2 (else plain progressive decay).
        t_up, t_low, gamma1, gamma2: Algorithm 2's thresholds and rate factors.
        beta_d, beta_m, beta_c, beta_m1, beta_m2, beta_label: loss weights. kappa: floor ``-kappa`` of ``L_c``.
        ifgsm_eps, ifgsm_alpha, ifgsm_steps: the i-FGSM imitation attack (Linf budget, step, iterations).
        lr_decay: per-epoch multiplicative learning-rate decay (0.99 in the thesis).
        condition: the label the generator is conditioned on in validation and test, ``"prediction"`` (``F``'s) or
            ``"true_label"`` (see :class:`~lightning_dprobust.robustness.ain_attack.AINAttack`).
        num_classes, input_shape: the data's (linked from the data module by the CLI).
        mean, std: ignored (linked from the data module): the generator works on ``[0, 1]`` images and the target
            carries its own normalization.
        **kwargs: see :class:`~lightning_dprobust.methods.base.ClassifierModule` (``optimizer``, ``lr``, ...).
    """

    def __init__(
        self,
        target: str | nn.Module = "mlp_tanh.erm_digits",
        target_class: int | None = 8,
        generator_kwargs: dict[str, Any] | None = None,
        noise_std: float = 0.1,
        noise_seed: int = 0,
        initial_bound: float = 0.8,
        decay: Literal["step", "exp", "time"] = "exp",
        decay_rate: float = -0.02,
        decay_step_size: int = 1,
        min_bound: float = 0.0,
        adaptive: bool = True,
        t_up: float = 1e-4,
        t_low: float = 1e-5,
        gamma1: float = 0.5,
        gamma2: float = 0.5,
        beta_d: float = 0.05,
        beta_m: float = 1.0,
        beta_c: float = 1.0,
        beta_m1: float = 1.0,
        beta_m2: float = 0.1,
        beta_label: float = 1.0,
        kappa: float = 5.0,
        ifgsm_eps: float = 0.2,
        ifgsm_alpha: float = 0.004,
        ifgsm_steps: int = 50,
        lr_decay: float = 0.99,
        condition: Condition = "prediction",
        optimizer: Literal["sgd", "adam", "adamw"] = "adam",
        lr: float = 1e-3,
        num_classes: int = 10,
        input_shape: Sequence[int] = (1, 8, 8),
        mean: Sequence[float] | None = None,
        std: Sequence[float] | None = None,
        **kwargs: Any,
    ) -> None:
        input_shape = tuple(input_shape)
        _check_arguments(target_class, num_classes, initial_bound, decay, decay_rate, decay_step_size, ifgsm_steps)
        if condition not in CONDITIONS:
            raise ValueError(f"AIN(condition={condition!r}) is unknown: choose one of {CONDITIONS}")
        generator = AINGenerator(num_classes, input_shape, noise_std=noise_std, **(generator_kwargs or {}))
        super().__init__(
            model=generator, num_classes=num_classes, input_shape=input_shape, optimizer=optimizer, lr=lr, **kwargs
        )
        if isinstance(target, nn.Module):
            self.hparams.pop("target", None)
        self.target = load_target(target, num_classes, input_shape).requires_grad_(False)
        self.target.eval()
        self.target_class = target_class
        generator.target_class.fill_(-1 if target_class is None else target_class)
        generator.bound.fill_(initial_bound)
        self.controller = BoundController(
            initial_bound, decay_rate, decay, t_up, t_low, gamma1, gamma2, decay_step_size, min_bound, adaptive
        )
        self.imitation = ImitationTargets(self._imitation_attack(ifgsm_eps, ifgsm_alpha, ifgsm_steps))
        self.noise = torch.Generator().manual_seed(noise_seed)
        self.previous_weights: dict[str, Tensor] | None = None
        self.previous_optimizer: dict[str, Any] | None = None
        self.val_success, self.val_linf = MeanMetric(), MeanMetric()

    # ------------------------------------------------------------------------------------------------- model
    @property
    def generator(self) -> AINGenerator:
        """The generator (the base class's ``model``)."""
        return self.model

    @property
    def bound(self) -> float:
        """The current bound ``B`` (the generator's buffer)."""
        return float(self.generator.bound)

    def forward(self, x: Tensor) -> Tensor:
        """``F`` on AIN's examples of ``x``, conditioned on ``F``'s own prediction."""
        labels = self.target(x).argmax(dim=1)
        return self.target(self.generator(x, labels))

    def train(self, mode: bool = True) -> AIN:
        """Set the generator's mode; the target always stays in eval mode."""
        super().train(mode)
        self.target.eval()
        return self

    def _imitation_attack(self, eps: float, alpha: float, steps: int) -> torchattacks.BIM:
        attack = torchattacks.BIM(self.target, eps=eps, alpha=alpha, steps=steps)
        if self.target_class is not None:
            attack.set_mode_targeted_by_function(
                lambda images, labels: torch.full_like(labels, self.target_class), quiet=True
            )
        return attack

    # ---------------------------------------------------------------------------------------------- training
    def losses(self, x: Tensor, y: Tensor) -> dict[str, Tensor]:
        """Per-example ``distance`` (Eq 5.2), ``imitation`` (5.4), ``misclassification`` (5.5/5.6, floored at
        ``-kappa``), ``label`` (the extractor's cross-entropy) and their weighted sum ``loss`` (5.1 + label term)."""
        hp = self.hparams
        imitated, imitated_logits = self.imitation(self.target, x, y)
        z = self.generator.perturbation(x, y, self.noise)
        bound = self.generator.bound
        adversarial = (x + torch.maximum(torch.minimum(z, bound), -bound)).clamp(0.0, 1.0)
        logits = self.target(adversarial)
        parts = {
            "distance": distance_loss(adversarial - x),
            "imitation": imitation_loss(adversarial, imitated, logits, imitated_logits, hp.beta_m1, hp.beta_m2),
            "misclassification": misclassification_loss(logits, y, self.target_class, hp.kappa),
            "label": F.cross_entropy(self.generator.extractor(y)[1], y, reduction="none"),
        }
        total = ain_loss(
            parts["distance"], parts["imitation"], parts["misclassification"], hp.beta_d, hp.beta_m, hp.beta_c
        )
        return {**parts, "loss": total + hp.beta_label * parts["label"]}

    def per_example_loss(self, x: Tensor, y: Tensor) -> Tensor:
        """The training loss of each example (see :meth:`losses`)."""
        return self.losses(x, y)["loss"]

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        if self.private_step is not None:
            raise MisconfigurationException(
                "AIN trains an attack and takes no DP callback: drop the `dp` group (--dp null); train the classifier "
                "on AIN's examples privately instead (AdversarialAugmentation with AINAttack under DPCallback)"
            )
        x, y = batch
        check_batch(x, y, self.num_classes, self.input_shape)
        losses = {key: value.mean() for key, value in self.losses(x, y).items()}
        loss = losses["loss"]
        self.log("train/loss", losses.pop("loss"), prog_bar=True)
        self.log_dict({f"train/{key}": value for key, value in losses.items()}, on_step=False, on_epoch=True)
        self.log("ain/train_bound", self.bound, prog_bar=True)
        return loss

    def on_fit_start(self) -> None:
        self.noise = torch.Generator(device=self.device).manual_seed(self.hparams.noise_seed)
        if self.previous_weights is None:
            self.previous_weights = _snapshot(self.generator)
        if self.previous_optimizer is None:
            self.previous_optimizer = copy.deepcopy(self._optimizer().state_dict())

    def _optimizer(self) -> torch.optim.Optimizer:
        optimizer = self.optimizers(use_pl_optimizer=False)
        return optimizer[0] if isinstance(optimizer, list) else optimizer

    def _roll_back(self) -> None:
        """Restore the previous epoch's generator weights and optimizer state (Adam's ``exp_avg``, ``exp_avg_sq``,
        ``step``), keeping the current learning rate: the rolled-back epoch leaves no trace but the slower decay.
        The optimizer gets a copy, so the saved state is never updated in place."""
        self.generator.load_state_dict(self.previous_weights)
        optimizer = self._optimizer()
        state = copy.deepcopy(self.previous_optimizer)
        state["param_groups"] = optimizer.state_dict()["param_groups"]
        optimizer.load_state_dict(state)

    def _accept(self, bound: float) -> None:
        """Take the epoch: the generator gets the decayed ``bound``; its weights and the optimizer state are saved."""
        self.generator.bound.fill_(bound)
        self.previous_weights = _snapshot(self.generator)
        self.previous_optimizer = copy.deepcopy(self._optimizer().state_dict())

    # -------------------------------------------------------------------------------------------- validation
    def success(self, logits: Tensor, labels: Tensor) -> tuple[Tensor, Tensor]:
        """Per-example attack success and weight: targeted, ``F`` says ``t`` (examples of class ``t`` weigh 0);
        untargeted, ``F`` is wrong."""
        predicted = logits.argmax(dim=1)
        if self.target_class is None:
            return (predicted != labels).float(), torch.ones_like(labels, dtype=torch.float)
        return (predicted == self.target_class).float(), (labels != self.target_class).float()

    def _evaluate(self, batch: Any, stage: str, accuracy: Any) -> None:
        x, y = batch
        check_batch(x, y, self.num_classes, self.input_shape)
        noise = torch.Generator(device=x.device).manual_seed(0)
        condition = self.target(x).argmax(dim=1) if self.hparams.condition == "prediction" else y
        adversarial = self.generator(x, condition, generator=noise)
        success, weight = self.success(self.target(adversarial), y)
        if weight.sum() > 0:
            self.val_success.update(success, weight)
        self.val_linf.update((adversarial - x).flatten(1).abs().amax(dim=1))
        self.log(f"{stage}/success", self.val_success, prog_bar=True)
        self.log(f"{stage}/linf", self.val_linf)
        if stage == "val" and not self.trainer.sanity_checking:
            self._examples = (x[:8].detach(), adversarial[:8].detach())

    def validation_success(self) -> float:
        """``S1``: the epoch's validation attack success rate, reduced over DDP ranks."""
        return float(self.val_success.compute())

    def on_validation_epoch_end(self) -> None:
        """Algorithm 2, lines 5-16, on the epoch's validation success rate (the same on every DDP rank)."""
        if self.trainer.sanity_checking:
            return
        decision = self.controller.update(self.validation_success())
        if decision.action == "rollback":
            self._roll_back()
        else:
            self._accept(decision.bound)
        self.log_dict(
            {
                "ain/bound": self.bound,
                "ain/decay_rate": decision.rate,
                "ain/rollback": float(decision.action == "rollback"),
            }
        )
        if getattr(self, "_examples", None) is not None:
            log_examples(self.trainer, *self._examples, self.current_epoch)

    def on_train_end(self) -> None:
        rank_zero_info(f"AIN: trained down to bound {self.bound:.4g}; attack with any bound >= it. Not a DP run.")

    # ----------------------------------------------------------------------------------------- checkpointing
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        super().on_save_checkpoint(checkpoint)
        checkpoint["ain"] = {
            "controller": self.controller.state_dict(),
            "previous_weights": self.previous_weights,
            "previous_optimizer": self.previous_optimizer,
        }

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        super().on_load_checkpoint(checkpoint)
        if "ain" in checkpoint:
            self.controller.load_state_dict(checkpoint["ain"]["controller"])
            self.previous_weights = checkpoint["ain"]["previous_weights"]
            self.previous_optimizer = checkpoint["ain"].get("previous_optimizer")

    def configure_optimizers(self) -> Any:
        optimizer = super().configure_optimizers()
        optimizer = optimizer["optimizer"] if isinstance(optimizer, dict) else optimizer
        scheduler = torch.optim.lr_scheduler.ExponentialLR(optimizer, gamma=self.hparams.lr_decay)
        return {"optimizer": optimizer, "lr_scheduler": scheduler}


def load_target(target: str | nn.Module, num_classes: int, input_shape: Sequence[int]) -> nn.Module:
    """AIN's target: a module, a Lightning ``.ckpt`` of a lightning-dprobust classifier (read with
    ``weights_only=True``, its class from the method registry), a zoo entry name or ``"timm/<arch>"``.

    Raises:
        ValueError: a ``.ckpt`` that does not exist, cannot be read, was not written by a lightning-dprobust classifier
            or is an AIN's own checkpoint; a name that is neither a zoo entry nor ``timm/<arch>``; a target that does
            not take images of ``input_shape`` or predict ``num_classes`` classes (trained for another dataset).
    """
    if isinstance(target, nn.Module) or not (Path(target).suffix == ".ckpt" or Path(target).exists()):
        return load_public_classifier(target, num_classes, input_shape, owner="AIN(target")
    from lightning_dprobust.methods.checkpoints import load_checkpoint_module

    try:
        module = load_checkpoint_module(target)
    except (FileNotFoundError, ValueError) as error:
        raise ValueError(
            f"AIN(target={target!r}): {error}. Pass a .ckpt written by `dprobust fit` of a classifier, a zoo entry or "
            "'timm/<arch>'"
        ) from error
    if isinstance(module, AIN):
        raise ValueError(
            f"AIN(target={target!r}) is an AIN checkpoint (an attack), not a classifier: pass the .ckpt of the "
            "classifier to attack"
        )
    return check_classifier_fits(module, num_classes, input_shape, f"AIN(target={target!r})")


def _snapshot(module: nn.Module) -> dict[str, Tensor]:
    return {key: value.detach().clone() for key, value in module.state_dict().items()}


def _check_arguments(target_class, num_classes, bound, decay, rate, step_size, ifgsm_steps) -> None:
    if target_class is not None and not 0 <= target_class < num_classes:
        raise ValueError(f"AIN(target_class={target_class}) must be a class in [0, {num_classes}) or null (untargeted)")
    if not 0 < bound <= 1:
        raise ValueError(f"AIN(initial_bound={bound}) must lie in (0, 1] (pixel units), e.g. 0.8 as in the thesis")
    if ifgsm_steps < 1:
        raise ValueError(f"AIN(ifgsm_steps={ifgsm_steps}) must be >= 1")
    try:
        check_decay(decay, rate, step_size)
    except ValueError as error:
        raise ValueError(f"AIN(decay={decay!r}, decay_rate={rate}): {error}") from error


__all__ = ["AIN", "ImitationTargets", "load_target"]
