"""StoBatch: Phan, Thai, Hu, Jin, Sun, Dou, "Scalable Differential Privacy with Certified Robustness in Adversarial
Learning", ICML 2020 (https://arxiv.org/abs/1903.09822)."""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from torch import Tensor
from torch.utils.data import DataLoader, Sampler

from lightning_dprobust.callbacks.dp_randomness import DPRandomness
from lightning_dprobust.callbacks.guard import refuse_checkpoint_upload
from lightning_dprobust.core import stobatch as sb
from lightning_dprobust.core.accounting import PrivacyLedger
from lightning_dprobust.core.sampling import derive_seed, keyed_generator
from lightning_dprobust.data.validation import check_batch
from lightning_dprobust.methods.base import ClassifierModule
from lightning_dprobust.models.stobatch import StoBatchNet
from lightning_dprobust.robustness.stobatch_attacks import ensemble_attack

SOURCES = ("stobatch.autoencoder", "stobatch.inputs", "stobatch.hidden", "stobatch.labels")
"""Ledger names of the four Laplace releases of Theorem 4: ``epsilon1``, ``epsilon1/gamma_x``, ``epsilon1/gamma``,
``epsilon2``."""

BATCH_NORM_CAVEAT = (
    "StoBatch with normalization='batch': the first layer of theta2 normalizes the perturbed hidden layer over the "
    "batch (batch statistics in training, running statistics in the weights), so one example moves the others' last "
    "hidden layer and Lemma 4's sensitivity of the label coefficients (2 |h_pi| per example) is not a proven bound: "
    "the epsilon is recorded as a nominal claim, not a guarantee; use normalization='none' for a DP guarantee "
    "(docs/sharp_edges.md)"
)
"""Printed at every fit with ``normalization="batch"``: why its epsilon is nominal."""

NOMINAL_SOURCE = "stobatch.batch_norm"
"""Ledger name of the nominal Theorem 4 epsilon of ``normalization="batch"`` (never a guarantee)."""

NOISE_BUFFERS = ("input_noise", "hidden_noise", "label_noise")
"""The network's buffers that hold the secret noise draw (``chi1 / m``, ``2 chi2 / m``, ``chi3``)."""


class FixedPairSampler(Sampler[list[int]]):
    """Yields, for every step, the ``m`` indices of the benign batch followed by the ``m`` of the adversarial-source
    batch, in the same order every epoch (:func:`~lightning_dprobust.core.stobatch.step_pairs`)."""

    def __init__(self, batches: Tensor, pairs: list[tuple[int, int]]) -> None:
        self.batches, self.pairs = batches, pairs

    def __iter__(self):
        for benign, adversarial in self.pairs:
            yield torch.cat([self.batches[benign], self.batches[adversarial]]).tolist()

    def __len__(self) -> int:
        return len(self.pairs)


class StoBatch(ClassifierModule):
    """DP auto-encoder, DP adversarial learning and fixed disjoint batches (Alg. 1; Alg. 4 under DDP).

    Before the first step (``on_fit_start``), once per model: Laplace noise ``chi1`` (inputs, scale
    ``Delta_R / (m epsilon1)``), ``chi2`` (first hidden layer, ``2 Delta_R / (m epsilon1)``) and ``chi3`` (label
    coefficients, ``Delta_L2 / epsilon2``) is drawn into the network's buffers, and the training set is cut into
    fixed disjoint batches of ``m`` (kept in checkpoints, not in the weights), both from secret randomness
    (:class:`~lightning_dprobust.callbacks.dp_randomness.DPRandomness`). A resumed fit restores both from the
    checkpoint and draws nothing. Each step then takes a benign batch and a different adversarial-source batch;
    crafts DP adversarial examples from the source's perturbed inputs with I-FGSM, MIM and PGD at a random size
    ``mu_t ~ U(0, mu_max]`` against predicted labels; updates ``theta1`` on the Taylor reconstruction loss of both and
    ``theta2`` on the Taylor cross-entropy ``(L_benign + xi L_adv) / (m (1 + xi))`` with ``chi3``. ``theta2``'s loss
    reads ``h_bar`` detached, ``theta1``'s loss never reaches ``theta2``. After each step ``theta1`` is projected to
    input norm ``<= theta1_bound`` (``Delta_h``). Under DDP each rank owns fixed pairs of batches (Alg. 4) and the
    gradients are averaged (the parameter server's rule).

    Guarantee (Theorem 4, as the paper states it): ``epsilon = epsilon1 (1 + 1/gamma_x + 1/gamma) + epsilon2``-DP
    (pure, ``delta = 0``) for the parameters, whatever the number of steps, recorded in :attr:`ledger` as four
    Laplace releases, with the default per-example network (``model_kwargs.normalization="none"``: ``theta2`` reads
    each example's ``h = tanh(theta1 * x_bar)``, post-processing of the ``epsilon1 / gamma_x`` input release, with no
    statistic over other examples). With ``normalization="batch"`` (the paper's batch normalization) one example
    moves the others' ``h_pi`` and Lemma 4 does not hold: the same epsilon is recorded as a nominal claim (the
    ledger's DP epsilon is ``inf``, the fit reports "no DP guarantee; nominal epsilon ..."). It assumes: one noise
    draw, the same disjoint batches in every epoch, inputs and ``h`` in
    ``[-1, 1]``, ``h_pi`` in ``[-1, 1]``, and the paper's accounting (``Delta_x = 1``; the ``epsilon1 3 beta /
    Delta_R`` cost of the ``theta1`` gradient dropped as negligible; one ``chi2`` shared by all coordinates; each
    feature map of the first layer counted separately), see spec section 15 item 9. The guarantee needs the noise
    draw to stay secret: it is never in the network's ``state_dict`` (what a release ships); training checkpoints
    (``.ckpt``) keep it, with the fixed batches, so that a resume draws nothing; they are secret training state.

    Args:
        epsilon: total budget ``epsilon`` of Theorem 4.
        budget_split: ``"mnist"``, ``"cifar10"`` or ``"tiny_imagenet"`` (Appendix P).
        batch_size: ``m``, the size of each fixed batch (the data module's ``batch_size`` is not used in training).
        xi: weight of the adversarial loss (Eq. 9).
        psi: shrink of the fresh inference noise (Appendix N).
        inference_noise: ``"released"`` (eval with a zero offset in place of the draw, and under
            ``normalization="batch"`` the first normalization on the batch's statistics: what the released weights
            give) or ``"training_draw"`` (the paper's Appendix N,
            reusing the secret draw of a private checkpoint), see
            :class:`~lightning_dprobust.models.stobatch.StoBatchNet`.
        attack_steps: ``T_mu`` of the training attacks (step ``mu_t / T_mu``).
        mu_max: largest training attack size in the paper's ``[-1, 1]`` units (``mu_max / 2`` in pixel units).
        theta1_bound: ``Delta_h``.
        reconstruction: ``"absolute"`` (bounded below, the authors' code) or ``"linear"`` (Eq. 6).
        noise_seed: fix the noise and the batches (test mode, warned); ``None``: secret randomness.
        attack_seed: seed of ``mu_t`` and of PGD's random starts (public randomness).
        model_kwargs: architecture of :class:`~lightning_dprobust.models.stobatch.StoBatchNet`.
        **kwargs: see :class:`~lightning_dprobust.methods.base.ClassifierModule` (``mean``/``std`` are ignored: the
            network maps ``[0, 1]`` to ``[-1, 1]`` itself).
    """

    def __init__(
        self,
        epsilon: float = 2.0,
        budget_split: sb.BudgetSplit = "mnist",
        batch_size: int = 120,
        xi: float = 1.0,
        psi: float = 2.0,
        inference_noise: str = "released",
        attack_steps: int = 10,
        mu_max: float = 1.0,
        theta1_bound: float = 1.0,
        reconstruction: sb.ReconstructionForm = "absolute",
        noise_seed: int | None = None,
        attack_seed: int = 0,
        model_kwargs: dict[str, Any] | None = None,
        optimizer: str = "adam",
        lr: float = 1e-3,
        **kwargs: Any,
    ) -> None:
        _check_arguments(batch_size, xi, psi, attack_steps, mu_max, theta1_bound, reconstruction)
        if inference_noise not in ("released", "training_draw"):
            raise ValueError(f"inference_noise={inference_noise!r} must be 'released' or 'training_draw'")
        for fixed in ("model", "mean", "std"):  # the network and its [-1, 1] mapping are StoBatch's own
            kwargs.pop(fixed, None)
        super().__init__(model="stobatch_cnn", model_kwargs=model_kwargs, optimizer=optimizer, lr=lr, **kwargs)
        net = self.net
        net.inference_noise = inference_noise
        self.delta_r = sb.reconstruction_sensitivity(net.patch_size, net.neurons)
        self.delta_l2 = sb.label_sensitivity(net.head.in_features)
        self.gamma_x = sb.gamma_x(self.delta_r, batch_size)
        self.gamma = sb.gamma_h(self.delta_r, batch_size, theta1_bound)
        self.epsilon1, self.epsilon2 = sb.split_budget(float(epsilon), budget_split, self.gamma, self.gamma_x)
        sb.project_theta1(net.encoder.weight, theta1_bound)
        self.randomness = DPRandomness(noise_seed, owner="StoBatch")
        self.ledger = PrivacyLedger()
        self.batches = torch.zeros(0, batch_size, dtype=torch.long)  # in checkpoints, never in released weights
        self.privacy_delta = 0.0

    @property
    def net(self) -> StoBatchNet:
        """The :class:`StoBatchNet` behind the (identity) normalization."""
        return self.model.net

    @property
    def zoo_nominal_privacy(self) -> bool:
        """Whether a zoo build records the epsilon as nominal (``normalization="batch"``), not as a guarantee."""
        return self.net.normalization == "batch"

    @property
    def input_scale(self) -> float:
        """Laplace scale of each input coordinate's noise, ``Delta_R / (m epsilon1)`` (Eq. 16)."""
        return self.delta_r / (self.hparams.batch_size * self.epsilon1)

    @property
    def hidden_scale(self) -> float:
        """Laplace scale of each first-layer neuron's noise, ``2 Delta_R / (m epsilon1)`` (Eq. 17)."""
        return 2 * self.input_scale

    @property
    def label_scale(self) -> float:
        """Laplace scale of each label coefficient's batch-sum noise, ``Delta_L2 / epsilon2`` (Lemma 4)."""
        return self.delta_l2 / self.epsilon2

    def draw_noise(self, generator: torch.Generator) -> None:
        """Draw ``chi1 / m``, ``2 chi2 / m`` and ``chi3`` from ``generator`` into the network (refused if drawn)."""
        net = self.net
        net.set_noise(
            sb.laplace(tuple(net.input_noise.shape), self.input_scale, generator),
            sb.laplace(tuple(net.hidden_noise.shape), self.hidden_scale, generator),
            sb.laplace(tuple(net.label_noise.shape), self.label_scale, generator),
        )

    # ------------------------------------------------------------------------------------------- the privacy layer
    def on_fit_start(self) -> None:
        """Draw the noise once (secret randomness, the same on every rank) and record the four Laplace releases.
        A logger that would upload the checkpoints, which keep the draw, is refused first."""
        refuse_checkpoint_upload(self.trainer, "the secret Laplace noise draw of StoBatch")
        if not bool(self.net.noise_drawn) or self.batches.numel() == 0:
            self.randomness.next_fit()
            self.randomness.start(self.trainer)
        if not bool(self.net.noise_drawn):
            self.draw_noise(self.randomness.noise_generator(0, self.device))
        self._record_privacy()
        source = self.trainer.datamodule if self.trainer.datamodule is not None else self
        original = source.train_dataloader
        source.train_dataloader = lambda: self._fixed_loader(original())
        self._loader_source = source

    def _fixed_loader(self, loader: DataLoader) -> DataLoader:
        """The data module's dataset served in fixed pairs of fixed disjoint batches (drawn on the first call)."""
        if self.batches.numel() == 0:
            generator = keyed_generator("cpu", self.randomness.mask_seed(), "fixed batches")
            self.batches = sb.fixed_disjoint_batches(len(loader.dataset), self.hparams.batch_size, generator)
        pairs = sb.step_pairs(len(self.batches), self.trainer.world_size, self.trainer.global_rank)
        sampler = FixedPairSampler(self.batches, pairs)
        return DataLoader(loader.dataset, batch_sampler=sampler, num_workers=loader.num_workers)

    def _record_privacy(self) -> None:
        """Four Laplace releases (``normalization="none"``), or their sum as a nominal claim (``"batch"``)."""
        releases = (self.epsilon1, self.epsilon1 / self.gamma_x, self.epsilon1 / self.gamma, self.epsilon2)
        if self.net.normalization == "batch":
            rank_zero_warn(BATCH_NORM_CAVEAT)
            self.ledger.record_nominal(NOMINAL_SOURCE, sum(releases), 0.0)
            return
        for source, epsilon in zip(SOURCES, releases, strict=True):
            self.ledger.record_laplace(source, epsilon)

    def setup(self, stage: str) -> None:
        connector = self.trainer._accelerator_connector
        if stage == "fit" and connector.is_distributed and connector.use_distributed_sampler:
            raise MisconfigurationException(
                "StoBatch: under DDP each rank trains on its own fixed batches; set Trainer(use_distributed_sampler="
                "False) (trainer.use_distributed_sampler: false in the config)"
            )

    def teardown(self, stage: str) -> None:
        source = getattr(self, "_loader_source", None)
        if stage == "fit" and source is not None and "train_dataloader" in vars(source):
            del source.train_dataloader

    # ------------------------------------------------------------------------------------------------ the losses
    def stobatch_losses(self, x: Tensor, y: Tensor, mu: float, generator: torch.Generator) -> tuple[Tensor, Tensor]:
        """``(R_bar, L_bar)`` of one step on a ``2m`` batch: ``m`` benign examples, then ``m`` adversarial sources.

        ``R_bar`` (Eq. 6, Theorem 2) depends on ``theta1`` only, ``L_bar`` (Eq. 9 with ``chi3``) on ``theta2`` only.
        The true labels of the sources are used only for the adversarial loss, never for crafting.
        """
        m, net, xi = self.hparams.batch_size, self.net, self.hparams.xi
        x_bar = net.perturb(x)
        adversarial = ensemble_attack(
            lambda z: net.classify(net.features(z)), x_bar[m:], mu, self.hparams.attack_steps, generator
        )
        inputs = torch.cat([x_bar[:m], adversarial])
        h_bar = net.hidden(inputs).detach()
        reconstruction = sb.reconstruction_loss(inputs, net.reconstruct(h_bar), self.hparams.reconstruction) / (2 * m)
        logits = net.classify(h_bar if net.normalization == "batch" else net.features(inputs).detach())
        targets = F.one_hot(y, self.num_classes).to(logits.dtype)
        noise = sb.label_noise_term(net.label_noise, net.head.weight)
        benign = sb.taylor_cross_entropy(logits[:m], targets[:m]) - noise
        adversarial_loss = sb.taylor_cross_entropy(logits[m:], targets[m:]) - noise
        return reconstruction, (benign + xi * adversarial_loss) / (m * (1 + xi))

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        x, y = batch
        check_batch(x, y, self.num_classes, self.input_shape)
        if len(x) != 2 * self.hparams.batch_size:
            raise RuntimeError(f"StoBatch expects batches of 2 m = {2 * self.hparams.batch_size}, got {len(x)}")
        seed = derive_seed(self.hparams.attack_seed, "stobatch", self.global_rank, self.global_step)
        generator = torch.Generator(device=self.device).manual_seed(seed)
        u = torch.rand((), generator=generator, device=self.device)
        mu = float(self.hparams.mu_max * (1 - u))  # mu_t in (0, mu_max]
        reconstruction, classification = self.stobatch_losses(x, y, mu, generator)
        self.log_dict({"train/reconstruction": reconstruction, "train/loss": classification}, prog_bar=True)
        return reconstruction + classification

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        """Keep ``theta1``'s input norm ``<= Delta_h`` so that ``gamma`` stays what the budget split assumed."""
        sb.project_theta1(self.net.encoder.weight, self.hparams.theta1_bound)

    def on_train_epoch_end(self) -> None:
        """Log a nominal claim as ``privacy/nominal_epsilon`` (a guarantee is logged as ``privacy/epsilon`` by the
        run's ledger logger)."""
        if self.ledger.nominal:
            self.log("privacy/nominal_epsilon", self.ledger.nominal[0].epsilon, rank_zero_only=True)

    def on_fit_end(self) -> None:
        accuracy = self.trainer.callback_metrics.get("val/acc")
        if accuracy is not None and float(accuracy) <= 1.5 / self.num_classes:
            rank_zero_warn(
                f"StoBatch: validation accuracy {float(accuracy):.3f} is at chance: raise model_kwargs.feature_gain "
                f"(now {self.net.feature_gain:g}), max_epochs (epsilon does not depend on them) or batch_size"
            )
        if self.ledger.nominal:
            rank_zero_info(f"StoBatch: {self.ledger.nominal_summary()}: {BATCH_NORM_CAVEAT}")
            return
        rank_zero_info(
            f"StoBatch: epsilon = {self.ledger.epsilon(0.0):.4g} (pure DP, delta = 0; epsilon1 = {self.epsilon1:.4g}, "
            f"epsilon2 = {self.epsilon2:.4g}, gamma_x = {self.gamma_x:.4g}, gamma = {self.gamma:.4g}); the same "
            "whatever the number of steps"
        )

    # -------------------------------------------------------------------------------------- PixelDP certification
    pixeldp_attack_norm = "linf"

    @torch.no_grad()
    def pixeldp_scores(self, x: Tensor, n: int, generator: torch.Generator) -> Tensor:
        """``[n, B, K]`` composed scores ``p_x * p_h`` (Eq. 11, Corollary 1, Appendix N) for ``x`` in ``[0, 1]``.

        Draw ``t``: ``p_x`` = softmax with fresh input noise ``Lap(Delta_R / (m epsilon1 psi))`` on top of the offset
        and the hidden noise held at its offset; ``p_h`` = softmax with fresh hidden noise
        ``Lap(2 Delta_R / (m epsilon1 psi))`` and the input noise held. The offset is the training draw under
        ``inference_noise="training_draw"`` and zero under ``"released"`` (fresh noise only). Fresh noise comes from
        ``generator`` only and never touches the buffers. Call in eval mode.
        """
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise ValueError(f"n={n!r} must be an int >= 1 (the Monte-Carlo draws)")
        net, psi = self.net, self.hparams.psi
        x_bar = net.perturb(x)
        h_fixed = net.features(x_bar)
        scores = []
        for _ in range(n):
            fresh_x = sb.laplace(tuple(x.shape), self.input_scale / psi, generator).to(x)
            fresh_h = sb.laplace(tuple(h_fixed.shape), self.hidden_scale / psi, generator).to(x)
            p_x = net.classify(net.features(x_bar + fresh_x)).softmax(-1)
            p_h = net.classify(h_fixed + fresh_h).softmax(-1)
            scores.append(p_x * p_h)
        return torch.stack(scores)

    def pixeldp_radius_scale(self) -> float:
        """Certified l_inf radius in ``[0, 1]`` pixel units per unit of ``epsilon_r*`` (Eq. 13).

        ``Delta_R / (m epsilon1 (Delta_r^x + Delta_r^h / 2)) / 2`` with sound sensitivities for the unit l_inf ball
        of the paper's ``[-1, 1]`` scale: ``Delta_r^x`` = the number of input coordinates, ``Delta_r^h = beta sum_f
        ||w_f||_1`` (spec section 15 item 6); the final ``/ 2`` converts ``[-1, 1]`` units to pixel units. It does not
        divide by ``psi`` (the paper does not); a strict certificate also divides by ``hparams.psi``.
        """
        net = self.net
        delta_rx = math.prod(net.input_shape)
        delta_rh = net.neurons * float(net.encoder.weight.detach().abs().sum())
        return sb.radius_factor(self.delta_r, self.hparams.batch_size, self.epsilon1, delta_rx, delta_rh) / 2

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        super().on_save_checkpoint(checkpoint)
        checkpoint["privacy_ledger"] = self.ledger.state_dict()
        checkpoint["stobatch_randomness"] = self.randomness.state_dict()
        checkpoint["stobatch_batches"] = self.batches
        if bool(self.net.noise_drawn):  # secret training state: the checkpoint, never the weights
            checkpoint["stobatch_noise"] = {name: getattr(self.net, name).cpu() for name in NOISE_BUFFERS}

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Restore the ledger, the noise draw and the fixed batches (a resume serves the same batches and draws
        nothing). A checkpoint that held the draw in its ``state_dict`` is read too, and the draw moved out of it."""
        super().on_load_checkpoint(checkpoint)
        state = checkpoint.get("state_dict", {})
        legacy = {name: state.pop(f"model.net.{name}") for name in NOISE_BUFFERS if f"model.net.{name}" in state}
        state.pop("model.net.noise_drawn", None)
        noise = checkpoint.get("stobatch_noise", legacy)
        if noise and not bool(self.net.noise_drawn):
            self.net.set_noise(*(noise[name] for name in NOISE_BUFFERS))
        if "privacy_ledger" in checkpoint:
            self.ledger.load_state_dict(checkpoint["privacy_ledger"])
        self.randomness.load_state_dict(checkpoint.get("stobatch_randomness", {}))
        if "stobatch_batches" in checkpoint:
            self.batches = checkpoint["stobatch_batches"].cpu()


def _check_arguments(batch_size: int, xi: float, psi: float, steps: int, mu_max: float, bound: float, form: str):
    """One clear line for each argument out of range."""
    checks = (
        (isinstance(batch_size, int) and batch_size >= 3, f"batch_size={batch_size!r} must be an int >= 3 (m)"),
        (xi >= 0, f"xi={xi!r} must be >= 0 (the paper uses 1 or 1.5)"),
        (psi >= 1, f"psi={psi!r} must be >= 1 (it shrinks the inference noise; the paper uses 2 or 10)"),
        (isinstance(steps, int) and steps >= 1, f"attack_steps={steps!r} must be an int >= 1"),
        (0 < mu_max <= 2, f"mu_max={mu_max!r} must lie in (0, 2] ([-1, 1] units; the paper draws mu_t in (0, 1])"),
        (bound > 0, f"theta1_bound={bound!r} must be > 0"),
        (form in ("absolute", "linear"), f"reconstruction={form!r} must be 'absolute' or 'linear'"),
    )
    for ok, message in checks:
        if not ok:
            raise ValueError(message)
