"""Shared LightningModule for every classifier method: model construction, steps, metrics and optimizers.

A method subclasses :class:`ClassifierModule` and overrides at most two things:

* :meth:`ClassifierModule.training_inputs`: the per-example tensors of a training batch (for example an extra
  leading "views" dimension for augmentation groups);
* :meth:`ClassifierModule.per_example_loss`: a loss vector with one entry per example.

The training step never reduces the loss itself when ``DPCallback`` is attached: the callback installs a private
gradient step that differentiates :meth:`per_example_loss` one example at a time (``core/per_sample.py``), so a
method cannot accidentally mix examples.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import Any, Literal, TypeVar

import lightning as L
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torchmetrics.classification import MulticlassAccuracy

from lightning_dprobust.checkpoint_io import check_state_dict_fits
from lightning_dprobust.data.validation import check_batch
from lightning_dprobust.methods.registry import add_method, qualified_name, register_project_method
from lightning_dprobust.models import create_model

TrainInputs = tuple[Tensor, ...]
InputTransform = Callable[["ClassifierModule", TrainInputs], TrainInputs]
PrivateStep = Callable[[TrainInputs], Tensor]

CLASS_KEY = "dprobust_class"
"""Checkpoint key holding ``module:QualName`` of the LightningModule that wrote it, looked up in
:mod:`lightning_dprobust.methods.registry` when loading (never imported)."""

_OPTIMIZERS = {"sgd": torch.optim.SGD, "adam": torch.optim.Adam, "adamw": torch.optim.AdamW}


class ClassifierModule(L.LightningModule):
    """Image classifier with cross-entropy loss; trains non-privately, or privately under ``DPCallback``.

    Args:
        model: a name from :func:`lightning_dprobust.models.list_models` (e.g. ``"cnn_tanh"``,
            ``"timm/resnet18"``) or a ready ``nn.Module`` that maps ``[0, 1]`` images to logits.
        num_classes: number of classes (linked from the data module by the CLI).
        input_shape: ``(C, H, W)`` of one image (linked from the data module by the CLI).
        mean: per-channel mean of the model's normalization layer (``None``: no normalization).
        std: per-channel std of the model's normalization layer.
        model_kwargs: extra arguments of the model constructor.
        pretrained: load pretrained weights (timm models; the weights must be reachable or cached).
        optimizer: ``"sgd"``, ``"adam"`` or ``"adamw"`` (under ``DPCallback``: DP-SGD, DP-Adam, DP-AdamW).
        lr: learning rate.
        momentum: SGD momentum.
        weight_decay: L2 penalty (acts on the parameters, not the data, so it costs no privacy).
        lr_schedule: ``"constant"`` or ``"cosine"`` (cosine annealing over ``trainer.max_epochs``).
    """

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        register_project_method(cls)

    def __init__(
        self,
        model: str | nn.Module = "cnn_tanh",
        num_classes: int = 10,
        input_shape: Sequence[int] = (1, 8, 8),
        mean: Sequence[float] | None = None,
        std: Sequence[float] | None = None,
        model_kwargs: dict[str, Any] | None = None,
        pretrained: bool = False,
        optimizer: Literal["sgd", "adam", "adamw"] = "sgd",
        lr: float = 0.1,
        momentum: float = 0.0,
        weight_decay: float = 0.0,
        lr_schedule: Literal["constant", "cosine"] = "constant",
    ) -> None:
        super().__init__()
        self.save_hyperparameters(ignore=["model"] if isinstance(model, nn.Module) else None)
        if optimizer not in _OPTIMIZERS:
            raise ValueError(f"optimizer must be one of {sorted(_OPTIMIZERS)}, got {optimizer!r}")
        if not lr > 0:
            raise ValueError(f"lr must be positive, got {lr}: set --model.lr to e.g. 0.1")
        if isinstance(model, nn.Module):
            self.model = model
        else:
            self.model = create_model(
                model,
                num_classes=num_classes,
                input_shape=tuple(input_shape),
                mean=mean,
                std=std,
                pretrained=pretrained,
                **(model_kwargs or {}),
            )
        self.num_classes = num_classes
        self.input_shape = tuple(input_shape)
        self.train_input_transforms: list[InputTransform] = []
        self.private_step: PrivateStep | None = None
        self.val_acc = MulticlassAccuracy(num_classes=num_classes, average="micro")
        self.test_acc = MulticlassAccuracy(num_classes=num_classes, average="micro")

    def forward(self, x: Tensor) -> Tensor:
        return self.model(x)

    def training_inputs(self, batch: Any) -> TrainInputs:
        """Per-example training tensors, all sharing the leading batch dimension: ``(images, labels)``."""
        x, y = batch
        return x, y

    def per_example_loss(self, x: Tensor, y: Tensor) -> Tensor:
        """Cross-entropy of each example, averaged over its views when ``x`` carries a views dimension.

        Shape:
            x: ``[B, C, H, W]`` or ``[B, V, C, H, W]`` (``V`` views of each example, averaged).
            y: ``[B]``. Returns ``[B]``.
        """
        if x.dim() == len(self.input_shape) + 1:
            return F.cross_entropy(self(x), y, reduction="none")
        batch, views = x.shape[:2]
        logits = self(x.flatten(0, 1))
        losses = F.cross_entropy(logits, y.repeat_interleave(views), reduction="none")
        return losses.view(batch, views).mean(dim=1)

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        check_batch(*batch, self.num_classes, self.input_shape)
        inputs = self.training_inputs(batch)
        for transform in self.train_input_transforms:
            inputs = transform(self, inputs)
        if self.private_step is not None:
            return self.private_step(inputs)
        loss = self.per_example_loss(*inputs).mean()
        self.log("train/loss", loss, prog_bar=True)
        return loss

    def _evaluate(self, batch: Any, stage: str, accuracy: MulticlassAccuracy) -> None:
        x, y = batch
        check_batch(x, y, self.num_classes, self.input_shape)
        logits = self(x)
        self.log(f"{stage}/loss", F.cross_entropy(logits, y), sync_dist=True)
        accuracy.update(logits, y)
        self.log(f"{stage}/acc", accuracy, prog_bar=True)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self._evaluate(batch, "val", self.val_acc)

    def test_step(self, batch: Any, batch_idx: int) -> None:
        self._evaluate(batch, "test", self.test_acc)

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """When a trainer resumes, refuse weights of another architecture with one clear error before loading them."""
        if self._trainer is not None:
            check_state_dict_fits(self, checkpoint["state_dict"], "--ckpt_path")

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Record the module's class so :func:`lightning_dprobust.cli.loading.load_classifier` can rebuild it."""
        checkpoint[CLASS_KEY] = qualified_name(type(self))

    def configure_optimizers(self) -> Any:
        hp = self.hparams
        params = [p for p in self.parameters() if p.requires_grad]
        kwargs: dict[str, Any] = {"lr": hp.lr, "weight_decay": hp.weight_decay}
        if hp.optimizer == "sgd":
            kwargs["momentum"] = hp.momentum
        optimizer = _OPTIMIZERS[hp.optimizer](params, **kwargs)
        if hp.lr_schedule == "constant":
            return optimizer
        scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=max(1, self.trainer.max_epochs or 1))
        return {"optimizer": optimizer, "lr_scheduler": scheduler}


register_project_method(ClassifierModule)

MethodType = TypeVar("MethodType", bound=type)


def register_method(cls: MethodType) -> MethodType:
    """Allow checkpoints that name ``cls`` to be loaded (:mod:`lightning_dprobust.methods.registry`); usable as a
    class decorator. Returns ``cls``.

    Guarantees: after the call, :func:`~lightning_dprobust.methods.registry.method_class` resolves
    ``qualified_name(cls)`` to ``cls``, and nothing else changes; registering the same class twice is a no-op.

    Raises:
        TypeError: ``cls`` is not a ``ClassifierModule`` subclass.
        ValueError: another class is already registered under the same ``"module:QualName"``.
    """
    if not (isinstance(cls, type) and issubclass(cls, ClassifierModule)):
        raise TypeError(f"register_method takes a ClassifierModule subclass, got {cls!r}")
    return add_method(cls)


_WARNED_ALIASES: set[tuple[str, str]] = set()


def renamed_seed(owner: str, old: str, old_value: int | None, seed: int | None) -> int | None:
    """The DP seed given to ``owner`` as ``seed``, or under its deprecated name ``old`` (``noise_seed``, ``dp_seed``):
    one concept, one name, as ``DPCallback(seed=...)``. The old name still loads saved configs and checkpoints; it
    warns once per class and name.

    Raises:
        ValueError: both names are given, with different values.
    """
    if old_value is None:
        return seed
    if seed is not None and seed != old_value:
        raise ValueError(f"{owner} got seed={seed!r} and {old}={old_value!r}, one seed under two names: keep seed")
    if (owner, old) not in _WARNED_ALIASES:
        _WARNED_ALIASES.add((owner, old))
        warnings.warn(f"{owner}({old}=...) is deprecated: write seed={old_value!r} (same meaning)", FutureWarning, 3)
    return old_value
