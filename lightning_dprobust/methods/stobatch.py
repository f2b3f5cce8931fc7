"""StoBatch: Phan, Thai, Hu, Jin, Sun, Dou, "Scalable Differential Privacy with Certified Robustness in Adversarial
Learning", ICML 2020 (https://arxiv.org/abs/1903.09822).

StoBatch as implemented here offers NO differential-privacy guarantee: its epsilon (Theorem 4) is nominal. It is
recorded in the ledger as a nominal claim (the ledger's DP epsilon is ``inf``), logged as ``privacy/nominal_epsilon``
(never ``privacy/epsilon``), printed as "no DP guarantee; nominal epsilon ...", and released in the zoo with the
accountant ``"nominal"`` (docs/design.md, contracts 4 and 12). Theorem 4 does not follow from what the code does
(:data:`NOMINAL_WARNING`): the input release is counted with ``Delta_x = 1`` where one example's l1 range in
``[-1, 1]^(C H W)`` is ``2 C H W`` (128 on digits), each feature map of ``theta1`` is counted alone instead of
composed with the others, the hidden and label noise are one draw shared by every batch and step, and the labels
reach ``theta2``'s hidden layers through the gradient of the unnoised ``- z y`` term (only the output coefficients
get ``chi3``).
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from torch import Tensor
from torch.utils.data import DataLoader, Dataset, Sampler

from lightning_dprobust.callbacks.dp_randomness import DPRandomness
from lightning_dprobust.callbacks.guard import refuse_checkpoint_upload
from lightning_dprobust.core import stobatch as sb
from lightning_dprobust.core.accounting import DEFAULT_ACCOUNTANT, PrivacyLedger
from lightning_dprobust.core.sampling import derive_seed, keyed_generator
from lightning_dprobust.data.validation import check_batch
from lightning_dprobust.methods.base import ClassifierModule, renamed_seed
from lightning_dprobust.models.stobatch import StoBatchNet
from lightning_dprobust.robustness.stobatch_attacks import ensemble_attack

NOMINAL_SOURCE = "stobatch.theorem4"
"""Ledger name of the nominal Theorem 4 epsilon (never a guarantee)."""

NOMINAL_WARNING = (
    "StoBatch's epsilon is nominal, NOT a differential-privacy guarantee: Theorem 4 counts the input release with "
    "sensitivity 1 where one example's l1 range is 2 C H W, counts each feature map of theta1 alone instead of "
    "composing them, reuses one hidden and one label noise draw across all batches, and lets the labels reach "
    "theta2's hidden layers without noise"
)
"""Printed at every fit and with the final epsilon: why the epsilon is nominal."""

BATCH_NORM_CAVEAT = (
    "; with normalization='batch' the first layer of theta2 also normalizes over the batch, so one example moves the "
    "others' last hidden layer (Lemma 4's premise fails too)"
)
"""Appended to :data:`NOMINAL_WARNING` for ``normalization="batch"``."""

NOISE_BUFFERS = ("hidden_noise", "label_noise")
"""The network's buffers that hold the secret hidden and label noise draw (``2 chi2 / m``, ``chi3``)."""

INPUT_NOISE_KEY = 1
"""Key of the input-noise generator (:meth:`DPRandomness.noise_generator`); key 0 draws the hidden and label noise."""


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


class BatchTagged(Dataset):
    """``(x, y, b)``: each example of ``dataset`` with the number ``b`` of the fixed batch it belongs to, so that a
    training step adds each example's own batch's input noise (:func:`~lightning_dprobust.core.stobatch.
    batch_membership`)."""

    def __init__(self, dataset: Dataset, membership: Tensor) -> None:
        self.dataset, self.membership = dataset, membership

    def __getitem__(self, index: int) -> tuple[Any, Any, Tensor]:
        x, y = self.dataset[index]
        return x, y, self.membership[index]

    def __len__(self) -> int:
        return len(self.membership)


class StoBatch(ClassifierModule):
    """DP auto-encoder, adversarial learning and fixed disjoint batches (Alg. 1; Alg. 4 under DDP), with a nominal
    epsilon.

    Before the first step, once per model and from secret randomness
    (:class:`~lightning_dprobust.callbacks.dp_randomness.DPRandomness`; design, contract 8): the training set is cut
    into fixed disjoint batches of ``m`` (Alg. 1 line 2); Laplace noise ``chi2`` (first hidden layer, scale
    ``2 Delta_R / (m epsilon1)``) and ``chi3`` (label coefficients, ``Delta_L2 / epsilon2``) is drawn once into the
    network's buffers (Alg. 1 line 1); and the input noise ``chi1_b`` (scale ``Delta_R / (m epsilon1)``, Eq. 16) is
    drawn independently for each fixed batch ``b`` (:meth:`draw_input_noise`). All of it is kept in checkpoints,
    never in the weights; a resumed fit restores it and draws nothing.

    Input noise per batch: Alg. 1 line 1 draws one ``chi1`` and line 2 adds it to every batch. Then all perturbed
    inputs share one offset, so ``x_bar_i - x_bar_j = x_i - x_j`` for any two training examples: knowing one image
    gives every other one exactly. Eq. 16 needs one ``Lap(Delta_R / epsilon1)`` per batch sum, and the proof of
    Theorem 4 (Appendix J, Eq. 24) factorizes the release over the disjoint batches, which needs the batches' noise to
    be independent: here each batch gets its own ``chi1_b``, used by all its examples at every step (so Eq. 16 holds
    for each batch) and by no other batch. This removes that reconstruction; it does not make the epsilon a guarantee.

    Each step then takes a benign batch and a different adversarial-source batch; crafts adversarial examples from the
    source's perturbed inputs with I-FGSM, MIM and PGD at a random size ``mu_t ~ U(0, mu_max]`` against predicted
    labels; updates ``theta1`` on the Taylor reconstruction loss of both and ``theta2`` on the Taylor cross-entropy
    ``(L_benign + xi L_adv) / (m (1 + xi))`` with ``chi3``. ``theta2``'s loss reads ``h_bar`` detached, ``theta1``'s
    loss never reaches ``theta2``. After each step ``theta1`` is projected to input norm ``<= theta1_bound``
    (``Delta_h``). Under DDP each rank owns fixed pairs of batches (Alg. 4) and the gradients are averaged.

    Privacy: NO differential-privacy guarantee. Theorem 4's ``epsilon = epsilon1 (1 + 1/gamma_x + 1/gamma) +
    epsilon2`` (pure, ``delta = 0``) is recorded in :attr:`ledger` as a nominal claim (its DP epsilon is ``inf``),
    logged as ``privacy/nominal_epsilon`` and printed with :data:`NOMINAL_WARNING`, because it does not follow from what
    the code does: (a) the input release is counted as ``epsilon1 / gamma_x`` with the paper's ``Delta_x = 1``, but
    one example moves ``2 C H W`` in l1 (with independent noise per batch that costs ``2 C H W epsilon1 / gamma_x``,
    62.4 instead of 0.487 on digits at epsilon 2);
    (b) ``Delta_R`` is the sensitivity of one feature map and each map is counted alone, while all maps read the same
    example, so they compose; (c) ``chi2`` and ``chi3`` are one draw shared by every batch and step, and ``chi2`` by
    every reconstruction coordinate (spec section 15 item 9), so the batches' releases are not independent; (d) the
    labels enter the gradient of ``theta2``'s hidden layers through the ``- z y`` term, which no noise covers (``chi3``
    perturbs the output coefficients only); with ``normalization="batch"`` Lemma 4's per-example premise fails too
    (:data:`BATCH_NORM_CAVEAT`). The ``epsilon1 3 beta / Delta_R`` cost of the ``theta1`` gradient is dropped as in the
    paper. Measure leakage empirically if a bound matters. The noise draws stay secret all the same: never in the
    network's ``state_dict`` (what a release ships); training checkpoints (``.ckpt``) keep them, with the fixed
    batches, so that a resume draws nothing; they are secret training state.

    Args:
        epsilon: total nominal budget ``epsilon`` of Theorem 4 (it sets the noise scales; not a guarantee).
        budget_split: ``"mnist"``, ``"cifar10"`` or ``"tiny_imagenet"`` (Appendix P).
        batch_size: ``m``, the size of each fixed batch (the data module's ``batch_size`` is not used in training).
        xi: weight of the adversarial loss (Eq. 9).
        psi: shrink of the fresh inference noise (Appendix N).
        inference_noise: ``"released"`` (eval with a zero offset in place of the draw, and under
            ``normalization="batch"`` the first normalization on the batch's statistics: what the released weights
            give) or ``"training_draw"`` (the paper's Appendix N, reusing the secret hidden draw of a private
            checkpoint), see :class:`~lightning_dprobust.models.stobatch.StoBatchNet`.
        attack_steps: ``T_mu`` of the training attacks (step ``mu_t / T_mu``).
        mu_max: largest training attack size in the paper's ``[-1, 1]`` units (``mu_max / 2`` in pixel units).
        theta1_bound: ``Delta_h``.
        reconstruction: ``"absolute"`` (bounded below, the authors' code) or ``"linear"`` (Eq. 6).
        seed: fix the noise and the batches (test mode, warned); ``None``: secret randomness. ``noise_seed`` is its
            deprecated name.
        attack_seed: seed of ``mu_t`` and of PGD's random starts (public randomness).
        model_kwargs: architecture of :class:`~lightning_dprobust.models.stobatch.StoBatchNet`.
        **kwargs: see :class:`~lightning_dprobust.methods.base.ClassifierModule` (``mean``/``std`` are ignored: the
            network maps ``[0, 1]`` to ``[-1, 1]`` itself).
    """

    zoo_nominal_privacy = True
    """A zoo build records the epsilon with the accountant ``"nominal"`` (no DP guarantee)."""

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
        seed: int | None = None,
        attack_seed: int = 0,
        model_kwargs: dict[str, Any] | None = None,
        optimizer: str = "adam",
        lr: float = 1e-3,
        noise_seed: int | None = None,
        **kwargs: Any,
    ) -> None:
        seed = renamed_seed("StoBatch", "noise_seed", noise_seed, seed)
        _check_arguments(batch_size, xi, psi, attack_steps, mu_max, theta1_bound, reconstruction)
        if inference_noise not in ("released", "training_draw"):
            raise ValueError(f"inference_noise={inference_noise!r} must be 'released' or 'training_draw'")
        for fixed in ("model", "mean", "std"):  # the network and its [-1, 1] mapping are StoBatch's own
            kwargs.pop(fixed, None)
        super().__init__(model="stobatch_cnn", model_kwargs=model_kwargs, optimizer=optimizer, lr=lr, **kwargs)
        self.hparams.pop("noise_seed", None)
        self.hparams["seed"] = seed  # under its one name, whichever name it was given
        net = self.net
        net.inference_noise = inference_noise
        self.delta_r = sb.reconstruction_sensitivity(net.patch_size, net.neurons)
        self.delta_l2 = sb.label_sensitivity(net.head.in_features)
        self.gamma_x = sb.gamma_x(self.delta_r, batch_size)
        self.gamma = sb.gamma_h(self.delta_r, batch_size, theta1_bound)
        self.epsilon1, self.epsilon2 = sb.split_budget(float(epsilon), budget_split, self.gamma, self.gamma_x)
        sb.project_theta1(net.encoder.weight, theta1_bound)
        self.randomness = DPRandomness(seed, owner="StoBatch")
        self.ledger = PrivacyLedger()
        self.ledger.record_nominal(NOMINAL_SOURCE, self.nominal_epsilon, 0.0)
        # secret training state: in checkpoints, never in released weights
        self.batches = torch.zeros(0, batch_size, dtype=torch.long)
        self.input_draws = torch.zeros(0, *net.input_shape)
        self.privacy_delta, self.privacy_accountant = 0.0, DEFAULT_ACCOUNTANT  # LedgerOwner; nominal claims only

    @property
    def net(self) -> StoBatchNet:
        """The :class:`StoBatchNet` behind the (identity) normalization."""
        return self.model.net

    @property
    def nominal_epsilon(self) -> float:
        """Theorem 4's ``epsilon1 (1 + 1/gamma_x + 1/gamma) + epsilon2``, the ``epsilon`` argument by the budget
        split: nominal, never a DP guarantee."""
        return float(self.hparams.epsilon)

    @property
    def nominal_warning(self) -> str:
        """:data:`NOMINAL_WARNING`, with :data:`BATCH_NORM_CAVEAT` under ``normalization="batch"``."""
        return NOMINAL_WARNING + (BATCH_NORM_CAVEAT if self.net.normalization == "batch" else "")

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
        """Draw ``2 chi2 / m`` and ``chi3`` from ``generator`` into the network, once (refused if drawn)."""
        net = self.net
        net.set_noise(
            sb.laplace(tuple(net.hidden_noise.shape), self.hidden_scale, generator),
            sb.laplace(tuple(net.label_noise.shape), self.label_scale, generator),
        )

    def draw_input_noise(self, num_batches: int, generator: torch.Generator) -> None:
        """Draw ``chi1_b / m ~ Lap(Delta_R / (m epsilon1))`` per input coordinate, independently for each of the
        ``num_batches`` fixed batches ``b`` (row ``b`` of :attr:`input_draws`), from ``generator`` only.

        Raises:
            RuntimeError: the input noise was drawn already (a second draw would be a second release).
        """
        if self.input_draws.numel():
            raise RuntimeError("StoBatch input noise is drawn once per model; this module already holds its draws")
        shape = (int(num_batches), *self.net.input_shape)
        self.input_draws = sb.laplace(shape, self.input_scale, generator).cpu()

    def input_offsets(self, membership: Tensor, like: Tensor) -> Tensor:
        """Each example's ``chi1_b / m``: the row of :attr:`input_draws` of its batch number in ``membership``."""
        if not self.input_draws.numel() or bool((membership < 0).any()):
            raise RuntimeError(
                "StoBatch adds each example its own fixed batch's input noise: train through trainer.fit, which "
                "serves the fixed batches"
            )
        return self.input_draws.to(like)[membership.to(self.input_draws.device)]

    # ------------------------------------------------------------------------------------------- the privacy layer
    def on_fit_start(self) -> None:
        """Draw the hidden and label noise once (secret randomness, the same on every rank) and warn that the epsilon
        is nominal. A logger that would upload the checkpoints, which keep the draws, is refused first."""
        refuse_checkpoint_upload(self.trainer, "the secret Laplace noise draw of StoBatch")
        if not bool(self.net.noise_drawn) or not self.batches.numel() or not self.input_draws.numel():
            self.randomness.next_fit()
            self.randomness.start(self.trainer)
        if not bool(self.net.noise_drawn):
            self.draw_noise(self.randomness.noise_generator(0, self.device))
        rank_zero_warn(f"{self.nominal_warning} (nominal epsilon {self.nominal_epsilon:.4g})")
        source = self.trainer.datamodule if self.trainer.datamodule is not None else self
        original = source.train_dataloader
        source.train_dataloader = lambda: self._fixed_loader(original())
        self._loader_source = source

    def _fixed_loader(self, loader: DataLoader) -> DataLoader:
        """The data module's dataset, each example tagged with its batch number, served in fixed pairs of fixed
        disjoint batches; the batches and their input noise are drawn on the first call."""
        dataset = loader.dataset
        if not self.batches.numel():
            generator = keyed_generator("cpu", self.randomness.mask_seed(), "fixed batches")
            self.batches = sb.fixed_disjoint_batches(len(dataset), self.hparams.batch_size, generator)
        if not self.input_draws.numel():
            self.draw_input_noise(len(self.batches), self.randomness.noise_generator(INPUT_NOISE_KEY, self.device))
        pairs = sb.step_pairs(len(self.batches), self.trainer.world_size, self.trainer.global_rank)
        tagged = BatchTagged(dataset, sb.batch_membership(self.batches, len(dataset)))
        return DataLoader(tagged, batch_sampler=FixedPairSampler(self.batches, pairs), num_workers=loader.num_workers)

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
    def stobatch_losses(
        self, x: Tensor, y: Tensor, mu: float, generator: torch.Generator, offset: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        """``(R_bar, L_bar)`` of one step on a ``2m`` batch: ``m`` benign examples, then ``m`` adversarial sources.

        ``offset`` is each example's input noise ``chi1_b / m`` (:meth:`input_offsets`; ``None``: zero). ``R_bar``
        (Eq. 6, Theorem 2) depends on ``theta1`` only, ``L_bar`` (Eq. 9 with ``chi3``) on ``theta2`` only. The true
        labels of the sources are used only for the adversarial loss, never for crafting.
        """
        m, net, xi = self.hparams.batch_size, self.net, self.hparams.xi
        x_bar = net.perturb(x, offset)
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
        if len(batch) != 3:
            raise RuntimeError("StoBatch trains on its own fixed batches of (x, y, batch number): use trainer.fit")
        x, y, membership = batch
        check_batch(x, y, self.num_classes, self.input_shape)
        if len(x) != 2 * self.hparams.batch_size:
            raise RuntimeError(f"StoBatch expects batches of 2 m = {2 * self.hparams.batch_size}, got {len(x)}")
        seed = derive_seed(self.hparams.attack_seed, "stobatch", self.global_rank, self.global_step)
        generator = torch.Generator(device=self.device).manual_seed(seed)
        u = torch.rand((), generator=generator, device=self.device)
        mu = float(self.hparams.mu_max * (1 - u))  # mu_t in (0, mu_max]
        reconstruction, classification = self.stobatch_losses(x, y, mu, generator, self.input_offsets(membership, x))
        self.log_dict({"train/reconstruction": reconstruction, "train/loss": classification}, prog_bar=True)
        return reconstruction + classification

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        """Keep ``theta1``'s input norm ``<= Delta_h`` so that ``gamma`` stays what the budget split assumed."""
        sb.project_theta1(self.net.encoder.weight, self.hparams.theta1_bound)

    def on_train_epoch_end(self) -> None:
        """Log the nominal claim as ``privacy/nominal_epsilon`` (never ``privacy/epsilon``: no DP guarantee)."""
        self.log("privacy/nominal_epsilon", self.ledger.nominal[0].epsilon, rank_zero_only=True)

    def on_fit_end(self) -> None:
        accuracy = self.trainer.callback_metrics.get("val/acc")
        if accuracy is not None and float(accuracy) <= 1.5 / self.num_classes:
            rank_zero_warn(
                f"StoBatch: validation accuracy {float(accuracy):.3f} is at chance: raise model_kwargs.feature_gain "
                f"(now {self.net.feature_gain:g}), max_epochs (epsilon does not depend on them) or batch_size"
            )
        rank_zero_info(
            f"StoBatch: {self.ledger.nominal_summary()} (epsilon1 = {self.epsilon1:.4g}, epsilon2 = "
            f"{self.epsilon2:.4g}, gamma_x = {self.gamma_x:.4g}, gamma = {self.gamma:.4g}): {self.nominal_warning}"
        )

    # -------------------------------------------------------------------------------------- PixelDP certification
    pixeldp_attack_norm = "linf"

    @torch.no_grad()
    def pixeldp_scores(self, x: Tensor, n: int, generator: torch.Generator) -> Tensor:
        """``[n, B, K]`` composed scores ``p_x * p_h`` (Eq. 11, Corollary 1, Appendix N) for ``x`` in ``[0, 1]``.

        Draw ``t``: ``p_x`` = softmax with fresh input noise ``Lap(Delta_R / (m epsilon1 psi))`` and the hidden noise
        held at its offset; ``p_h`` = softmax with fresh hidden noise ``Lap(2 Delta_R / (m epsilon1 psi))`` and no
        fresh input noise. The hidden offset is the training draw under ``inference_noise="training_draw"`` and zero
        under ``"released"``; there is no input offset (each fixed batch had its own input draw). Fresh noise comes
        from ``generator`` only and never touches the buffers. Call in eval mode.
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
        checkpoint["stobatch_input_noise"] = self.input_draws
        if bool(self.net.noise_drawn):  # secret training state: the checkpoint, never the weights
            checkpoint["stobatch_noise"] = {name: getattr(self.net, name).cpu() for name in NOISE_BUFFERS}

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Restore the noise draws and the fixed batches (a resume serves the same batches and draws nothing).

        The ledger is not read back: its nominal claim follows from the hyper-parameters (a checkpoint written when
        StoBatch recorded Laplace releases as a guarantee must not bring them back). A checkpoint that held the
        hidden and label draw in its ``state_dict`` is read too, and the draw moved out of it; the single input draw
        shared by all batches of such checkpoints is dropped, and a resume draws one per batch.
        """
        super().on_load_checkpoint(checkpoint)
        state = checkpoint.get("state_dict", {})
        legacy = {name: state.pop(f"model.net.{name}") for name in NOISE_BUFFERS if f"model.net.{name}" in state}
        for name in ("input_noise", "noise_drawn"):
            state.pop(f"model.net.{name}", None)
        noise = checkpoint.get("stobatch_noise", legacy)
        if noise and not bool(self.net.noise_drawn):
            self.net.set_noise(*(noise[name] for name in NOISE_BUFFERS))
        self.input_draws = checkpoint.get("stobatch_input_noise", self.input_draws).cpu()
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
