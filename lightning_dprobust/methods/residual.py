"""Residual perturbation: Tao, Ling, Shi, Wang, "Deep Learning with Data Privacy via Residual Perturbation", ICLR
2021 submission (OpenReview eNSpdJeR_J; arXiv 2408.05723)."""

from __future__ import annotations

from typing import Any, Literal

from lightning.pytorch.utilities import rank_zero_info
from torch import Tensor

from lightning_dprobust.core.accounting import DEFAULT_ACCOUNTANT, PrivacyLedger
from lightning_dprobust.core.residual_privacy import PAPER_BOUND, theorem1_epsilon
from lightning_dprobust.methods.base import ClassifierModule, renamed_seed
from lightning_dprobust.models import create_model
from lightning_dprobust.models.residual_noise import NoiseScale, Strategy

NOMINAL_SOURCE = "residual_perturbation.theorem1"
"""The ledger name of the Theorem 1 claim."""
NOMINAL_WARNING = "a heuristic proof, NOT a differential-privacy guarantee; audit it with `dprobust audit`"


class ResidualPerturbation(ClassifierModule):
    """Trains ``En_K``: ``K`` residual networks with noise in every residual block, their logits averaged.

    The algorithm (the paper has no algorithm box; section 2 and EnResNet): each forward draws fresh Gaussian noise
    after every residual block (and on the input), in training **and** at inference; the ``K`` members' logits are
    averaged and the cross-entropy of the average is minimised with ordinary SGD. There are no per-example
    gradients, no clipping and no gradient noise, so ``DPCallback`` is not used (the default ResNet8 has
    BatchNorm, which it refuses).

    Privacy: the only privacy statement is Theorem 1 (Strategy I), whose epsilon is **nominal**: it assumes Gaussian
    residual outputs with means bounded by ``G`` and inputs in a ball of radius ``R``, and treats the unclipped
    gradients as post-processing of noisy activations, none of which the training enforces. It is recorded in
    :attr:`ledger` as a nominal event (never composed: the ledger's DP epsilon is ``inf``), logged as
    ``privacy/nominal_epsilon`` (never ``privacy/epsilon``) and printed at the end of fit as "no DP guarantee;
    nominal epsilon ..." with that warning. Strategy II has no training-time theorem (Theorem 2 is a
    per-query statement about the prediction), so its nominal epsilon is ``inf``. Measure the actual leakage with
    the membership audit (``dprobust audit``).

    Args:
        model: a registered residual network (default ``preact_resnet8``) or ``timm/resnet*``.
        strategy: ``"additive"`` (Strategy I) or ``"multiplicative"`` (Strategy II).
        gamma: noise coefficient of every residual block, >= 0 (0 with ``ensemble_size=1``: the plain ResNet8).
        input_noise: std ``pi`` of the input noise in pixel units; ``None``: ``gamma / 2`` for Strategy I (the
            paper), 0 for Strategy II.
        eta: Strategy II's floor on ``|x|`` (0: the paper's experiments).
        ensemble_size: ``K``, the members of ``En_K``, >= 1.
        combine: ``"logits"`` (EnResNet) or ``"probabilities"``.
        noise_scale: ``"absolute"`` (the paper) or ``"tensor_std"`` (EnResNet).
        noise_at_eval: keep the noise at inference (the paper); ``False`` for analysis only.
        seed: fix the noise (test mode, warned); ``None`` draws the seed from the operating system. ``noise_seed`` is
            its deprecated name.
        nominal_delta: ``delta`` of the nominal Theorem 1 epsilon.
        nominal_bound: ``G = R``, the bounds Theorem 1 assumes (30 in the paper).
        **kwargs: see :class:`~lightning_dprobust.methods.base.ClassifierModule`.

    The network is the registry's ``residual_perturbation`` model (``NormalizedModel`` around the ensemble, each
    member behind its own normalization), so zoo entries rebuild it with :func:`create_model`.

    Example:
        >>> import torch
        >>> module = ResidualPerturbation(gamma=0.3, ensemble_size=2, num_classes=10, input_shape=(1, 8, 8))
        >>> module(torch.rand(4, 1, 8, 8)).shape
        torch.Size([4, 10])
    """

    def __init__(
        self,
        model: str = "preact_resnet8",
        strategy: Strategy = "additive",
        gamma: float = 0.3,
        input_noise: float | None = None,
        eta: float = 0.0,
        ensemble_size: int = 1,
        combine: Literal["logits", "probabilities"] = "logits",
        noise_scale: NoiseScale = "absolute",
        noise_at_eval: bool = True,
        seed: int | None = None,
        nominal_delta: float = 1e-5,
        nominal_bound: float = PAPER_BOUND,
        noise_seed: int | None = None,
        **kwargs: Any,
    ) -> None:
        seed = renamed_seed("ResidualPerturbation", "noise_seed", noise_seed, seed)
        if not isinstance(model, str):
            raise ValueError("ResidualPerturbation builds its own ensemble: pass a model name, e.g. 'preact_resnet8'")
        super().__init__(model=model, **kwargs)
        self.hparams.pop("noise_seed", None)
        self.hparams["seed"] = seed  # under its one name, whichever name it was given
        if input_noise is None:
            input_noise = gamma / 2 if strategy == "additive" else 0.0
        hp = self.hparams
        self.model = create_model(
            "residual_perturbation",
            num_classes=self.num_classes,
            input_shape=self.input_shape,
            base=model,
            base_kwargs=hp.model_kwargs,
            member_mean=hp.mean,
            member_std=hp.std,
            ensemble_size=ensemble_size,
            combine=combine,
            seed=seed,
            strategy=strategy,
            gamma=gamma,
            input_noise=input_noise,
            eta=eta,
            noise_scale=noise_scale,
            noise_at_eval=noise_at_eval,
        )
        self.input_noise = input_noise
        self.ledger = PrivacyLedger()  # nominal claims only (LedgerOwner)
        self.privacy_delta, self.privacy_accountant = None, DEFAULT_ACCOUNTANT
        self.examples_seen = 0

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        """The ordinary cross-entropy step of the noisy ensemble; counts examples for the nominal epsilon."""
        self.examples_seen += len(batch[1]) * self.trainer.world_size
        return super().training_step(batch, batch_idx)

    def nominal_epsilon(self, epochs: float) -> float:
        """Theorem 1's nominal epsilon after ``epochs`` passes, both conditions (``gamma`` and ``pi``) enforced."""
        hp = self.hparams
        if hp.strategy != "additive":
            return float("inf")
        bound = hp.nominal_bound
        return theorem1_epsilon(hp.gamma, epochs, hp.nominal_delta, bound, self.input_noise, bound)

    def on_train_epoch_end(self) -> None:
        """Record and log the nominal epsilon of the passes made so far (``epochs = T b / N``)."""
        epochs = self.examples_seen / len(self.trainer.train_dataloader.dataset)
        self.ledger.record_nominal(NOMINAL_SOURCE, self.nominal_epsilon(epochs), self.hparams.nominal_delta)
        self.log("privacy/nominal_epsilon", self.ledger.nominal[0].epsilon, rank_zero_only=True)

    def on_fit_end(self) -> None:
        """Print the nominal epsilon, as no DP guarantee, with its warning."""
        if self.ledger.nominal:
            rank_zero_info(f"{type(self).__name__}: {self.ledger.nominal_summary()}: {NOMINAL_WARNING}")

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Also store the ledger and the example count, so a resumed run reports the same nominal epsilon."""
        super().on_save_checkpoint(checkpoint)
        checkpoint["privacy_ledger"] = self.ledger.state_dict()
        checkpoint["examples_seen"] = self.examples_seen

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        super().on_load_checkpoint(checkpoint)
        if "privacy_ledger" in checkpoint:
            self.ledger.load_state_dict(checkpoint["privacy_ledger"])
            self.examples_seen = int(checkpoint.get("examples_seen", 0))
