"""DP-Adv: Bu, Li, Long, Wu, "Practical Adversarial Training with Differential Privacy for Deep Learning"
(arXiv 2112.12497)."""

from __future__ import annotations

from functools import partial
from typing import Any

import torch
import torch.nn.functional as F
from lightning.pytorch.callbacks import Callback
from torch import Tensor, nn
from torchattacks.attack import Attack
from torchmetrics import MeanMetric
from torchmetrics.classification import MulticlassAccuracy, MulticlassCalibrationError, MultilabelAccuracy

from lightning_dprobust.callbacks.attack import AdversarialAugmentation
from lightning_dprobust.methods.base import ClassifierModule
from lightning_dprobust.metrics import PaperCalibrationError
from lightning_dprobust.robustness.attacks import attack_guard, build_attack
from lightning_dprobust.robustness.multilabel import MultilabelFGSM
from lightning_dprobust.robustness.randomness import AttackRandomness, attack_seed
from lightning_dprobust.robustness.separability import training_attack


class DPAdv(ClassifierModule):
    """Adversarial training inside DP-SGD: each sampled example is replaced by its adversarial version.

    The training attack is ordinary, non-private pre-processing run on the current model, one that makes example
    ``i``'s adversarial view a function of example ``i`` alone: FGSM, PGD, PGDL2, BIM, MIFGSM, or CW (run one example
    at a time); AutoAttack couples the examples of a batch and is refused for training (it stays available as
    ``eval_attack``). Privacy comes from ``DPCallback`` clipping each example's gradient at
    its adversarial point and adding noise, so the guarantee is exactly that of DP-SGD (or DP-Adam with
    ``optimizer="adam"``) with the same sample rate, noise and steps (Bu et al., Section 3.3). The loss uses only
    the adversarial examples (no benign term), as in the paper's Algorithm 1.

    Evaluation reports natural accuracy (``acc``), robust accuracy under ``eval_attack`` (``robust_acc``), the
    negative log-likelihood (``loss``), the standard 15-bin expected calibration error (``ece``) and the paper's
    unweighted 20-bin variant (``paper_ece``). With ``multilabel=True`` (CelebA's 40 attributes) the loss is the
    mean binary cross-entropy over labels and the metrics are per-attribute and mean accuracy. Each evaluation batch
    is attacked on its own stream (derived from the stage, the batch index and the attack's name) inside an isolated
    RNG, so evaluation during ``fit`` never changes the random streams training sees, and its numbers do not depend
    on what training drew.

    Args:
        attack: training attack name (see :func:`lightning_dprobust.robustness.attacks.build_attack`).
        attack_eps: training budget in pixel units.
        attack_kwargs: extra arguments of the training attack (``steps``, ``alpha``, ...).
        eval_attack: evaluation attack name (default: the training attack).
        eval_eps: evaluation budget (default: ``attack_eps``).
        eval_attack_kwargs: extra arguments of the evaluation attack.
        multilabel: targets are ``{0, 1}`` vectors (sigmoid outputs) instead of class indices.
        **kwargs: see :class:`~lightning_dprobust.methods.base.ClassifierModule`.
    """

    def __init__(
        self,
        attack: str = "PGD",
        attack_eps: float = 0.1,
        attack_kwargs: dict[str, Any] | None = None,
        eval_attack: str | None = None,
        eval_eps: float | None = None,
        eval_attack_kwargs: dict[str, Any] | None = None,
        multilabel: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if not attack_eps >= 0 or (eval_eps is not None and not eval_eps >= 0):
            raise ValueError(f"attack budgets must be >= 0, got attack_eps={attack_eps}, eval_eps={eval_eps}")
        self.save_hyperparameters()
        if multilabel and {attack.upper(), (eval_attack or attack).upper()} != {"FGSM"}:
            raise ValueError("multilabel=True supports attack='FGSM' only (FGSM on the BCE loss, as in DP-Adv)")
        try:  # fail fast on a bad name and on an attack that cannot run on private training data
            training_attack(build_attack(attack, nn.Linear(1, 1), attack_eps, **(attack_kwargs or {})))
        except ValueError as error:
            raise ValueError(f"DPAdv(attack={attack!r}): {error}") from error
        self.eval_attack_name = eval_attack or attack
        self.eval_eps = attack_eps if eval_eps is None else eval_eps
        self.eval_attack_kwargs = eval_attack_kwargs if eval_attack is not None else (attack_kwargs or {})
        self.metrics = nn.ModuleDict({stage: self._stage_metrics() for stage in ("val", "test")})

    def configure_callbacks(self) -> list[Callback]:
        hp = self.hparams
        factory = partial(_named_attack, hp.attack, hp.attack_eps, hp.attack_kwargs or {})
        return [AdversarialAugmentation(factory, mode="replace")]

    def per_example_loss(self, x: Tensor, y: Tensor) -> Tensor:
        if not self.hparams.multilabel:
            return super().per_example_loss(x, y)
        return F.binary_cross_entropy_with_logits(self(x), y.float(), reduction="none").mean(dim=1)

    # ------------------------------------------------------------------------------------------ evaluation
    def _stage_metrics(self) -> nn.ModuleDict:
        if self.hparams.multilabel:
            labels = self.num_classes
            return nn.ModuleDict(
                {
                    "acc": MultilabelAccuracy(num_labels=labels, average="macro"),
                    "robust_acc": MultilabelAccuracy(num_labels=labels, average="macro"),
                    "attribute_acc": MultilabelAccuracy(num_labels=labels, average=None),
                    "loss": MeanMetric(),
                }
            )
        classes = self.num_classes
        return nn.ModuleDict(
            {
                "acc": MulticlassAccuracy(num_classes=classes, average="micro"),
                "robust_acc": MulticlassAccuracy(num_classes=classes, average="micro"),
                "loss": MeanMetric(),
                "ece": MulticlassCalibrationError(num_classes=classes, n_bins=15, norm="l1"),
                "paper_ece": PaperCalibrationError(num_bins=20, norm="mean"),
            }
        )

    def _evaluate_adversarially(self, batch: Any, batch_idx: int, stage: str) -> None:
        x, y = batch
        metrics = self.metrics[stage]
        logits = self(x)
        metrics["loss"].update(self.per_example_loss(x, y))
        metrics["acc"].update(logits, y)
        metrics["robust_acc"].update(self(self._attack_for_evaluation(x, y, f"{stage}/{batch_idx}")), y)
        if self.hparams.multilabel:
            metrics["attribute_acc"].update(logits, y)
        else:
            probs = logits.softmax(dim=-1)
            metrics["ece"].update(probs, y)
            metrics["paper_ece"].update(probs, y)
        for name, metric in metrics.items():
            if name != "attribute_acc":
                self.log(f"{stage}/{name}", metric, prog_bar=name in ("acc", "robust_acc"))

    def on_test_epoch_end(self) -> None:
        if self.hparams.multilabel:
            per_attribute = self.metrics["test"]["attribute_acc"].compute()
            self.log_dict({f"test/attribute_acc/{i}": acc for i, acc in enumerate(per_attribute)})
            self.metrics["test"]["attribute_acc"].reset()

    def _attack_for_evaluation(self, x: Tensor, y: Tensor, where: str) -> Tensor:
        """Adversarial inputs for evaluation on the stream of ``where`` (stage and batch index), in an isolated RNG;
        escapes Lightning's inference mode, restores every module mode."""
        if x.shape[0] == 0:
            return x
        attack = _named_attack(self.eval_attack_name, self.eval_eps, self.eval_attack_kwargs, self)
        randomness = AttackRandomness(attack_seed(0, f"{where}/{self.eval_attack_name}"))
        with torch.inference_mode(False), torch.enable_grad(), attack_guard(self):
            return randomness.run(attack, x.clone(), y.clone())

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self._evaluate_adversarially(batch, batch_idx, "val")

    def test_step(self, batch: Any, batch_idx: int) -> None:
        self._evaluate_adversarially(batch, batch_idx, "test")


def _named_attack(name: str, eps: float, kwargs: dict[str, Any], model: nn.Module) -> Attack:
    """A suite attack on ``model``; a multi-label model is attacked with FGSM on its BCE loss."""
    if getattr(model, "hparams", {}).get("multilabel", False):
        return MultilabelFGSM(model, eps)
    return build_attack(name, model, eps, **kwargs)
