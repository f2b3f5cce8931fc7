"""DP-CERT: Wu, Kenney, Lecuyer, Hu, "Augment then Smooth: Reconciling Differential Privacy with Certified
Robustness", TMLR 2024 (arXiv 2306.08656)."""

from __future__ import annotations

from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import Tensor
from torchmetrics.classification import MulticlassAccuracy

from lightning_dprobust.methods.base import ClassifierModule, TrainInputs

Augmentation = Literal["gaussian", "smoothadv"]
Regularizer = Literal["none", "stability", "macer", "consistency"]
_DEFAULT_WEIGHTS = {"stability": None, "macer": 16.0, "consistency": 0.5, "none": 0.0}


class DPCert(ClassifierModule):
    """Trains a base classifier for randomized smoothing under DP-SGD with augmentation multiplicity.

    Each example ``x_i`` is presented as ``K + 1`` views (the clean ``x_i`` and ``K`` augmentations); the per-example
    loss averages the views' losses (plus an optional regularizer of the same example's views), and ``DPCallback``
    clips the gradient of that average: one clipped vector per sampled example, whatever ``K`` is.

    Variants (Table 1 of the paper, and the ablations of its Fig. 3):

    * ``augmentation="gaussian"``: ``x_i^j = x_i + N(0, sigma^2 I)`` (DP-Gaussian);
    * ``augmentation="smoothadv"``: ``x_i^j = x'_i + eta_j`` where ``x'_i`` is a SmoothAdv attack (Salman et al.
      2019) that *maximizes* the smoothed classifier's loss with the same draws ``eta_j`` (DP-SmoothAdv), with the
      paper's linear warm-up of the attack radius;
    * ``regularizer="stability"``: ``+ w (1/K) sum_j KL(F(x_i) || F(x_i^j))`` (DP-Stability, Eq. 5; default
      ``w = 1 / num_classes``, the weight of the authors' code);
    * ``regularizer="macer"``: MACER hinge ``(w sigma / 2)(gamma - xi_i)`` on correctly classified examples whose
      soft-smoothed margin ``xi_i = PhiInv(top1) - PhiInv(top2)`` is below ``gamma`` (DP-MACER, Eq. 12);
    * ``regularizer="consistency"``: ``+ w (1/K) sum_j KL(mean_j F(x_i^j) || F(x_i^j)) + eta H(mean_j F(x_i^j))``
      (the consistency ablation, Eq. 11);
    * PSAC clipping: ``DPCallback(clipping="psac")``.

    Guarantees:
        Every view and every loss term of example ``i`` is computed from example ``i`` alone (the reference code's
        row-pairing and attack-alignment bugs B1/B3 cannot occur: the DP engine evaluates each example on a batch
        of one). The privacy cost is exactly that of DP-SGD with the same sample rate, noise and steps.

    Args:
        augmentation: ``"gaussian"`` or ``"smoothadv"``.
        regularizer: ``"none"``, ``"stability"``, ``"macer"`` or ``"consistency"``.
        num_augmentations: ``K``, the number of augmented views per example (2 for MNIST, 1 for CIFAR-10).
        sigma: std of the Gaussian augmentation, in pixel units; certify with the same sigma.
        include_original: add the clean example as view 0 (the paper's default).
        regularization_weight: weight ``w`` of the regularizer (default per regularizer, see above).
        macer_gamma: MACER's margin threshold ``gamma`` (0.1). macer_beta: MACER's inverse temperature (16).
        consistency_entropy_weight: ``eta`` of the consistency regularizer's entropy term (0.5).
        smoothadv_eps: final L2 radius of the SmoothAdv attack (0.25). smoothadv_steps: PGD steps (2).
        smoothadv_warmup_epochs: epochs of linear warm-up of the radius (10).
        **kwargs: see :class:`~lightning_dprobust.methods.base.ClassifierModule`.
    """

    def __init__(
        self,
        augmentation: Augmentation = "gaussian",
        regularizer: Regularizer = "none",
        num_augmentations: int = 2,
        sigma: float = 0.25,
        include_original: bool = True,
        regularization_weight: float | None = None,
        macer_gamma: float = 0.1,
        macer_beta: float = 16.0,
        consistency_entropy_weight: float = 0.5,
        smoothadv_eps: float = 0.25,
        smoothadv_steps: int = 2,
        smoothadv_warmup_epochs: int = 10,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        _check_choice("augmentation", augmentation, ("gaussian", "smoothadv"))
        _check_choice("regularizer", regularizer, tuple(_DEFAULT_WEIGHTS))
        if num_augmentations < 1 or not sigma > 0:
            raise ValueError(
                f"num_augmentations must be >= 1 and sigma > 0, got {num_augmentations} and {sigma}: "
                "set --model.num_augmentations and --model.sigma"
            )
        if regularizer == "stability" and not include_original:
            raise ValueError("regularizer='stability' compares with the clean view: set include_original=True")
        self.save_hyperparameters()
        self.regularization_weight = (
            regularization_weight
            if regularization_weight is not None
            else _DEFAULT_WEIGHTS[regularizer] or 1.0 / self.num_classes
        )
        self.val_noisy_acc = MulticlassAccuracy(num_classes=self.num_classes, average="micro")

    # ------------------------------------------------------------------------------------------ augmentation
    def training_inputs(self, batch: Any) -> TrainInputs:
        """``(views [B, V, C, H, W], labels [B])`` with ``V = K + include_original``."""
        x, y = batch
        hp = self.hparams
        if hp.augmentation == "smoothadv":
            centre, noise = self._smoothadv(x, y)
        else:
            centre = x
            noise = hp.sigma * torch.randn((x.shape[0], hp.num_augmentations, *x.shape[1:]), device=x.device)
        views = centre.unsqueeze(1) + noise
        if hp.include_original:
            views = torch.cat([x.unsqueeze(1), views], dim=1)
        return views, y

    def smoothadv_radius(self) -> float:
        """Linearly warmed-up attack radius ``min(eps, (epoch + 1) eps / warmup)`` of the current epoch."""
        hp = self.hparams
        warmup = max(1, hp.smoothadv_warmup_epochs)
        return min(hp.smoothadv_eps, (self.current_epoch + 1) * hp.smoothadv_eps / warmup)

    def _smoothadv(self, x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
        """SmoothAdv points ``x'`` and the noise draws ``[B, K, ...]`` the attack used (reused for the views).

        The attack goes through the separability check of every attack on training data and draws only from its own
        generator, run in an isolated RNG; its seed is one draw of the global RNG per batch, so ``seed_everything``
        makes a run reproducible.
        """
        from lightning_dprobust.robustness.attacks import SmoothAdv, preserve_modes
        from lightning_dprobust.robustness.randomness import isolated_rng
        from lightning_dprobust.robustness.separability import training_attack

        hp = self.hparams
        if x.shape[0] == 0:  # an empty Poisson batch: nothing to attack
            return x, x.new_zeros((0, hp.num_augmentations, *x.shape[1:]))
        seed = int(torch.randint(0, 2**62, (1,)))  # from the global RNG, so seed_everything makes runs reproducible
        generator = torch.Generator(device=x.device).manual_seed(seed)
        attack = SmoothAdv(
            self,
            eps=self.smoothadv_radius(),
            sigma=hp.sigma,
            steps=hp.smoothadv_steps,
            num_noise=hp.num_augmentations,
            generator=generator,
        )
        with preserve_modes(self), torch.enable_grad(), isolated_rng():
            adversarial = training_attack(attack)(x.detach(), y)
        return adversarial.detach(), attack.last_noise.detach()

    # ------------------------------------------------------------------------------------------------ losses
    def per_example_loss(self, views: Tensor, y: Tensor) -> Tensor:
        """Mean cross-entropy over an example's views plus the regularizer of those views. ``[B]``."""
        batch, num_views = views.shape[:2]
        logits = self(views.flatten(0, 1)).view(batch, num_views, -1)
        ce = F.cross_entropy(logits.flatten(0, 1), y.repeat_interleave(num_views), reduction="none")
        loss = ce.view(batch, num_views).mean(dim=1)
        regularizer = self.hparams.regularizer
        if regularizer == "none":
            return loss
        augmented = logits[:, 1:] if self.hparams.include_original else logits
        if regularizer == "stability":
            return loss + self.regularization_weight * _kl(logits[:, :1], augmented).mean(dim=1)
        if regularizer == "consistency":
            return loss + self._consistency(augmented)
        return loss + self._macer(logits, y)

    def _consistency(self, augmented: Tensor) -> Tensor:
        log_probs = augmented.log_softmax(dim=-1)
        mean_probs = log_probs.exp().mean(dim=1, keepdim=True)
        kl = _kl_from_probs(mean_probs, log_probs).mean(dim=1)
        entropy = -(mean_probs.squeeze(1) * mean_probs.squeeze(1).clamp_min(1e-12).log()).sum(dim=-1)
        return self.regularization_weight * kl + self.hparams.consistency_entropy_weight * entropy

    def _macer(self, logits: Tensor, y: Tensor) -> Tensor:
        hp = self.hparams
        probs = (hp.macer_beta * logits).softmax(dim=-1).mean(dim=1)
        top = probs.topk(2, dim=-1)
        correct = top.indices[:, 0] == y
        bounded = top.values.clamp(1e-6, 1 - 1e-6)
        margin = torch.special.ndtri(bounded[:, 0]) - torch.special.ndtri(bounded[:, 1])
        active = correct & (margin.abs() <= hp.macer_gamma)
        hinge = (self.regularization_weight * hp.sigma / 2) * (hp.macer_gamma - margin)
        return torch.where(active, hinge, torch.zeros_like(hinge))

    # -------------------------------------------------------------------------------------------- validation
    def validation_step(self, batch: Any, batch_idx: int) -> None:
        super().validation_step(batch, batch_idx)
        x, y = batch
        noisy = x + self.hparams.sigma * torch.randn_like(x)
        self.val_noisy_acc.update(self(noisy), y)
        self.log("val/noisy_acc", self.val_noisy_acc)


def _kl(reference_logits: Tensor, logits: Tensor) -> Tensor:
    """``KL(softmax(reference) || softmax(logits))`` over the last dim, broadcast over views."""
    return _kl_from_probs(reference_logits.softmax(dim=-1), logits.log_softmax(dim=-1))


def _kl_from_probs(reference_probs: Tensor, log_probs: Tensor) -> Tensor:
    return (reference_probs * (reference_probs.clamp_min(1e-12).log() - log_probs)).sum(dim=-1)


def _check_choice(name: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"{name} must be one of {choices}, got {value!r}: set --model.{name}")
