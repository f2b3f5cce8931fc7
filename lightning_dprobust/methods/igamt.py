"""IGAMT: Imitative Generative Adversarial Mixed-embedding Transformer for differentially private synthesis of
temporal EHRs with missing values and irregular times (Tang 2021, PhD thesis, Emory University, chapter 4)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import torch
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from torch import Tensor, nn

from lightning_dprobust.methods import igamt_losses as losses
from lightning_dprobust.methods.ehr_module import EHRGenerativeModule, check_critic_schedule
from lightning_dprobust.models.ehr_release import ReleasedSynthesizer, assemble
from lightning_dprobust.models.ehr_transformer import (
    LATENTS,
    DecoderBody,
    EHRDecoder,
    EHREncoder,
    Generator,
    LatentCritic,
    OutputHeads,
    SequenceCritic,
    StepEmbedding,
    generate,
    sample_start,
    static_slots,
)

IMITATOR_SCHEDULE: dict[str, tuple[tuple[str, ...], ...]] = {
    # loss form: the terms of each of Dec_i's optimizer steps in one iteration
    "authors": (("adversarial",), ("match",)),
    "thesis": (("adversarial", "match"),),
}
Variant = Literal["igamt", "w/o_emb", "only_t_emb", "w/o_imi", "w/o_imi_var"]
VARIANTS: dict[str, tuple[bool, bool, bool, bool]] = {
    # name: (time embedding, static embedding, mask critic D_m, imitator Dec_i)
    "igamt": (True, True, True, True),
    "w/o_emb": (False, False, False, False),
    "only_t_emb": (True, False, False, False),
    "w/o_imi": (True, True, False, False),
    "w/o_imi_var": (True, True, True, False),
}
THESIS_LEAK = (
    "strict_dp=False (the thesis wiring): Enc and Dec's hidden layers learn from real data without noise and feed the "
    "noised components and the imitator, so one record's influence on the release is not bounded"
)


class IGAMT(EHRGenerativeModule):
    """IGAMT on EHR batches ``(x, m)`` ``[B, 1 + T, F]`` (see ``models/ehr_transformer.py`` for the data contract).

    Training (thesis Algorithm 1, EDGAMT base): per batch, when ``t % critic_freq_base < critic_freq_hit`` the
    critics D_x, D_z, D_m take one WGAN-GP step (Eqs 4.1, 4.2, ``l_dm``); then Enc (Eq 4.4), Dec (Eq 4.3 + ``D_m``
    terms), the imitator Dec_i (Eq 4.5; its optimizer excludes Dec's shared last layer) and G (Eq 4.6). Learning rates
    ``lr`` (Enc, Dec, Dec_i, G) and ``critic_lr``, decayed by ``lr_decay`` (0.99) per epoch; Adam throughout. The
    critics take one step on the sum of their losses (Eq 4.1's ``3 D_x(x m)`` form), where the authors' code steps D_x
    once per fake source; the code's generator gating (``gen_freq_*``) is not reproduced.

    Loss form (``loss_form``, :mod:`~lightning_dprobust.methods.igamt_losses`):

    * ``"authors"`` (default): the authors' code (Temporal-Synthesization, ``code/utils/ehr/igat/igamt_utils.py``,
      ``model_evaluation``): reconstruction and imitation **summed** over steps and features
      (``Transformer.compute_recon_loss`` / ``compute_mask_loss``), the mask reconstruction weighted by
      ``mask_weight`` (``beta_mask``), Dec_i imitating the masks too (``gen_m_match_loss``, ``input_m_match_loss``,
      ``output_m_match_loss``), and Dec_i taking **two** Adam steps per iteration: one on ``-D_x(x- m-) - D_m(m-)``,
      then one on the imitation terms, re-evaluated after the first (the code's "step 6: Update Imi").
    * ``"thesis"``: the thesis text (Eqs 4.4, 4.5): means over steps and features, the masked data only in the
      imitation, one Dec_i step on the whole ``l_imi``; the mask reconstruction weighted by ``recon_weight``.

    Privacy (``noise_multiplier`` not ``None``), through :class:`GenerativeDPModule`:

    * ``strict_dp=True`` (default): every component whose gradient reads real data, directly or through a component
      trained without noise, is private: the critics (jointly clipped), Enc and Dec (all layers). Dec_i's imitation
      targets that read real data (the real ``(x, m)`` and Dec's reconstruction ``(x^, m^)``) are **dropped**; Dec_i
      then learns from D_x, D_m (private) and Dec's synthesis ``(x~, m~)`` from G's draws (public), and G from D_z:
      both are post-processing, so Dec_i's steps (two per iteration in the authors' form) are no releases and the
      ledger composes the ``K`` releases of the critics, Enc and Dec only. The epsilon is a guarantee for everything
      trained, the release included.
    * ``strict_dp=False``: the thesis: noise only on D_x, D_z, D_m and Dec's last layer (on all of Dec and the
      critics in the ablations without an imitator, thesis 4.2.4), Dec_i keeps all three targets. Enc and Dec's hidden
      layers then carry un-noised information about every record into the noised components' per-example gradients
      and into Dec_i (spec 4.6 caveat 2, and more), so the accountant's number is **nominal**, never a guarantee.

    Data scaling is part of the mechanism: under ``strict_dp`` a data module whose ranges were read from the private
    training records (``EHRDataModule(scaling="train")``, the thesis's preprocessing) is refused at fit setup; with
    ``strict_dp=False`` it is allowed and the epsilon is nominal (it excludes the scaling's cost). The guarantee is per
    record: one patient on the synthetic and CSV sources, **per ED stay** on MIMIC-IV-ED (a patient with ``k`` stays
    at group size ``k``); the DP line printed at train start names the unit.

    Latent (``latent``): ``"pooled"`` (default): Enc mean-pools its states to one ``z [B, d]`` per record, G maps
    ``s [B, noise_size]`` to ``z~ [B, d]``, D_z is an MLP and Dec adds ``proj(z)`` to every step. ``"per_step"`` (the
    authors' code, whose seq2seq transformer keeps one memory state per step): Enc returns ``z [B, 1 + T, d]``, G is
    the same MLP at each position of ``s [B, 1 + T, noise_size]``, D_z is a :class:`SequenceCritic` over ``[B, 1 + T,
    d]`` (1-D convolutions of width 3; the code's D_z is a CNN with 16 filters of widths 2 and 3) and Dec adds
    ``proj(z_k)`` to step ``k``. Enc is bidirectional, so ``z_k`` carries the later steps too (a memory, not a causal
    state); Dec stays causal in ``(x, m)`` given ``z``. Synthesis draws ``z~`` for all ``1 + steps`` positions and
    Dec reads its prefix. Neither the private components nor the accounting depend on the latent.

    Released artifact (:meth:`release`): {G, Dec_i, Dec.last} (+ Dec_i's embeddings), or {G, Dec} without an
    imitator; it synthesizes from the static features' ranges alone.

    Args:
        num_features: ``F``. static_continuous / static_groups: the static layout of step 0 (continuous slots, then
            one one-hot group per entry, e.g. ``(2, 3)`` for gender and race).
        max_steps: the longest temporal sequence ``T``. d_model, heads, layers, d_ff: the transformers' sizes.
        noise_size: G's input (per step with ``latent="per_step"``). critic_hidden: the critics' width.
        latent: ``"pooled"`` (default) or ``"per_step"``, see above.
        variant: ``"igamt"`` or an ablation: ``"w/o_emb"``, ``"only_t_emb"``, ``"w/o_imi"``, ``"w/o_imi_var"``.
        strict_dp, loss_form: see above (``loss_form``: ``"authors"``, the default, or ``"thesis"``).
        real_weight: the real-term weight of the critic losses (``None``: the number of fake sources, 3 in Eq 4.1).
        gp_weight: WGAN-GP coefficient. recon_weight: weight of the reconstruction (the code's ``beta_recon``, 10).
        mask_weight: weight of the mask reconstruction in the authors' form (the code's ``beta_mask``, 1).
        critic_freq_base / critic_freq_hit: ``fb`` / ``fh`` of the critic schedule.
        synthetic_batch_size: G's and Dec_i's draws per step (independent of the Poisson batch size, which is private).
        **dp_kwargs: see :class:`GenerativeDPModule` (``noise_multiplier``, ``max_grad_norm``, ``clip_mode``, ...).
    """

    def __init__(
        self,
        num_features: int = 9,
        static_continuous: int = 2,
        static_groups: Sequence[int] = (2, 3),
        max_steps: int = 50,
        d_model: int = 32,
        heads: int = 2,
        layers: int = 1,
        d_ff: int = 64,
        noise_size: int = 32,
        critic_hidden: int = 32,
        variant: Variant = "igamt",
        strict_dp: bool = True,
        loss_form: losses.LossForm = "authors",
        real_weight: float | None = None,
        gp_weight: float = 10.0,
        recon_weight: float = 10.0,
        mask_weight: float = 1.0,
        critic_freq_base: int = 5,
        critic_freq_hit: int = 1,
        lr: float = 5e-4,
        critic_lr: float = 1e-4,
        synthetic_batch_size: int = 32,
        latent: Literal["pooled", "per_step"] = "pooled",
        **dp_kwargs: Any,
    ) -> None:
        super().__init__(**dp_kwargs)
        if variant not in VARIANTS:
            raise MisconfigurationException(f"variant must be one of {tuple(VARIANTS)}, got {variant!r}")
        if latent not in LATENTS:
            raise MisconfigurationException(f"latent must be one of {LATENTS}, got {latent!r}")
        if loss_form not in losses.LOSS_FORMS:
            raise MisconfigurationException(f"loss_form must be one of {losses.LOSS_FORMS}, got {loss_form!r}")
        check_critic_schedule(critic_freq_base, critic_freq_hit)
        self.save_hyperparameters()
        self.static_groups = tuple(int(g) for g in static_groups)
        self.num_static = static_slots(static_continuous, self.static_groups, num_features)
        self._build_networks()

    def _build_networks(self) -> None:
        """Enc, Dec (body + last layer), Dec_i, G and the critics of ``variant``."""
        hp = self.hparams
        time, static, self.has_mask_critic, self.has_imitator = VARIANTS[hp.variant]
        static = static and self.num_static > 0
        num_features, d_model, critic_hidden = hp.num_features, hp.d_model, hp.critic_hidden
        sizes = (d_model, hp.heads, hp.d_ff, hp.layers)

        def embedding() -> StepEmbedding:
            return StepEmbedding(num_features, d_model, hp.max_steps, self.num_static, time, static)

        per_step = hp.latent == "per_step"
        self.encoder = EHREncoder(embedding(), *sizes, pooled=not per_step)
        self.decoder = EHRDecoder(DecoderBody(embedding(), *sizes), OutputHeads(d_model, num_features))
        self.imitator = DecoderBody(embedding(), *sizes) if self.has_imitator else None
        self.generator = Generator(hp.noise_size, d_model, critic_hidden, per_step=per_step)
        self.critic_x = SequenceCritic(num_features, critic_hidden)
        self.critic_z = SequenceCritic(d_model, critic_hidden) if per_step else LatentCritic(d_model, critic_hidden)
        self.critic_m = SequenceCritic(num_features, critic_hidden) if self.has_mask_critic else None

    # ------------------------------------------------------------------------------------------- components
    def component_modules(self) -> dict[str, list[nn.Module]]:
        critics = [c for c in (self.critic_x, self.critic_z, self.critic_m) if c is not None]
        parts: dict[str, list[nn.Module]] = {"critics": critics, "encoder": [self.encoder]}
        if self._split_decoder():
            parts |= {"decoder_body": [self.decoder.body], "decoder_last": [self.decoder.last]}
        else:
            parts["decoder"] = [self.decoder]
        if self.imitator is not None:
            parts["imitator"] = [self.imitator]
        return parts | {"generator": [self.generator]}

    def _split_decoder(self) -> bool:
        """The thesis noises Dec's last layer only, which needs its own optimizer (with an imitator, non-strict)."""
        return self.imitator is not None and not self.hparams.strict_dp

    def private_components(self) -> frozenset[str]:
        if self.hparams.strict_dp:
            return frozenset({"critics", "encoder", "decoder"})
        return frozenset({"critics", "decoder_last" if self._split_decoder() else "decoder"})

    def learning_rates(self) -> dict[str, float]:
        return {
            name: self.hparams.critic_lr if name == "critics" else self.hparams.lr for name in self.component_modules()
        }

    def wiring_reason(self) -> str | None:
        return None if self.hparams.strict_dp else THESIS_LEAK

    # ------------------------------------------------------------------------------------------- forward parts
    def reconstruct(self, x: Tensor, m: Tensor, z: Tensor) -> tuple[Tensor, Tensor]:
        """Teacher-forced Dec: steps ``0..T-1`` -> ``(x^, m^)`` of steps ``1..T``, with the real step 0 prepended."""
        x_hat, m_hat = self.decoder(x[:, :-1], m[:, :-1], z)
        return torch.cat([x[:, :1], x_hat], dim=1), torch.cat([m[:, :1], m_hat], dim=1)

    def synthesize_with(self, body: DecoderBody, z: Tensor, start_x: Tensor, start_m: Tensor, steps: int):
        """Autoregressive synthesis through ``body`` and Dec's (shared) last layer."""
        return generate(body, self.decoder.last, z, start_x, start_m, steps)

    def draws(self, n: int, device: torch.device, length: int) -> tuple[Tensor, Tensor, Tensor]:
        """G's noise ``s`` and start steps for ``n`` synthetic records of ``length`` steps (``1 + T``; the shape of a
        per-step ``s``) (public randomness: no real data)."""
        hp = self.hparams
        start_x, start_m = sample_start(n, hp.num_features, hp.static_continuous, self.static_groups)
        noise = torch.randn(self.generator.noise_shape(n, length), device=device)
        return noise, start_x.to(device), start_m.to(device)

    # ------------------------------------------------------------------------------------------- losses
    def critics_loss(self, x, m, x_hat, m_hat, z, z_syn, x_syn, m_syn, x_imi, m_imi, alpha) -> Tensor:
        """``l_dx + l_dz (+ l_dm)`` with WGAN-GP, per example (fakes paired with example ``i``; all detached)."""
        hp = self.hparams
        fakes = [(x_hat, m_hat), (x_syn, m_syn)] + ([(x_imi, m_imi)] if self.imitator is not None else [])
        real = x * m
        loss = losses.critic_loss(self.critic_x(real), [self.critic_x(a * b) for a, b in fakes], hp.real_weight)
        loss = loss + losses.critic_loss(self.critic_z(z), [self.critic_z(z_syn)], hp.real_weight)
        for a, b in fakes:
            loss = loss + hp.gp_weight * losses.gradient_penalty(self.critic_x, real, a * b, alpha)
        loss = loss + hp.gp_weight * losses.gradient_penalty(self.critic_z, z, z_syn, alpha)
        if self.critic_m is not None:
            loss = loss + losses.critic_loss(self.critic_m(m), [self.critic_m(b) for _, b in fakes], hp.real_weight)
            for _, b in fakes:
                loss = loss + hp.gp_weight * losses.gradient_penalty(self.critic_m, m, b, alpha)
        return loss

    def reconstruction_loss(self, x: Tensor, m: Tensor, x_hat: Tensor, m_hat: Tensor) -> Tensor:
        """Weighted ``l_recon`` on steps ``1..T``: ``recon_weight data + w mask``, ``w`` = ``mask_weight`` in the
        authors' form (``beta_recon * recon_loss + beta_mask * mask_loss``), ``recon_weight`` in the thesis's."""
        hp = self.hparams
        data, mask = losses.reconstruction_terms(x[:, 1:], m[:, 1:], x_hat[:, 1:], m_hat[:, 1:], hp.loss_form)
        return hp.recon_weight * data + (hp.mask_weight if hp.loss_form == "authors" else hp.recon_weight) * mask

    def encoder_loss(self, x: Tensor, m: Tensor) -> Tensor:
        """Eq 4.4: ``l_recon + D_z(z)``."""
        z = self.encoder(x, m)
        x_hat, m_hat = self.reconstruct(x, m, z)
        return self.reconstruction_loss(x, m, x_hat, m_hat) + self.critic_z(z)

    def decoder_loss(self, x, m, z_syn, start_x, start_m) -> Tensor:
        """Eq 4.3 + EDGAMT: ``l_recon - (D_x(x^ m^) + D_x(x~ m~)) - (D_m(m^) + D_m(m~))``."""
        z = self.encoder(x, m).detach()
        x_hat, m_hat = self.reconstruct(x, m, z)
        x_syn, m_syn = self.synthesize_with(self.decoder.body, z_syn, start_x, start_m, x.shape[1] - 1)
        recon = self.reconstruction_loss(x, m, x_hat, m_hat)
        dx = [self.critic_x(x_hat * m_hat), self.critic_x(x_syn * m_syn)]
        dm = [self.critic_m(m_hat), self.critic_m(m_syn)] if self.critic_m is not None else []
        return recon + losses.decoder_adversarial(dx, dm)

    def imitator_loss(
        self, z_syn, start_x, start_m, targets: Sequence[losses.Record], terms: Sequence[str] = ("adversarial", "match")
    ) -> Tensor:
        """Eq 4.5 (+ ``-D_m(m-)``), the ``terms`` of one Dec_i step (:data:`IMITATOR_SCHEDULE`): ``"adversarial"``
        (``l_di``) and/or ``"match"`` (``l_im`` against ``targets``, records of steps ``1..T``: Dec's synthesis
        ``(x~, m~)`` first, then, without ``strict_dp``, Dec's reconstruction ``(x^, m^)`` and the real ``(x, m)``)."""
        x_imi, m_imi = self.synthesize_with(self.imitator, z_syn, start_x, start_m, targets[0][0].shape[1])
        loss = torch.zeros(z_syn.shape[0], device=z_syn.device)
        if "adversarial" in terms:
            dm = self.critic_m(m_imi) if self.critic_m is not None else None
            loss = loss + losses.imitation_adversarial(self.critic_x(x_imi * m_imi), dm)
        if "match" in terms:
            loss = loss + losses.imitation_match((x_imi[:, 1:], m_imi[:, 1:]), targets, self.hparams.loss_form)
        return loss

    def generator_loss(self, s: Tensor) -> Tensor:
        """Eq 4.6: ``-D_z(G(s))``."""
        return -self.critic_z(self.generator(s))

    # ------------------------------------------------------------------------------------------- training
    def train_iteration(self, x: Tensor, m: Tensor, iteration: int) -> dict[str, Tensor]:
        """One pass of Algorithm 1 on a batch; returns the mean loss of each component updated."""
        n, device, length = x.shape[0], x.device, x.shape[1]
        s, start_x, start_m = self.draws(n, device, length)
        logs: dict[str, Tensor] = {}
        if self.critics_scheduled(iteration):
            fakes = self._fakes(x, m, s, start_x, start_m)
            alpha = torch.rand(n, device=device)
            logs["critics"] = self.component_step("critics", "critics_loss", (x, m, *fakes, alpha))
        logs["encoder"] = self.component_step("encoder", "encoder_loss", (x, m))
        with torch.no_grad():
            z_syn = self.generator(s)
        dec_batch = (x, m, z_syn, start_x, start_m)
        for name in ("decoder_body", "decoder_last") if self._split_decoder() else ("decoder",):
            logs[name] = self.component_step(name, "decoder_loss", dec_batch)
        s_pub, start_x_pub, start_m_pub = self.draws(self.hparams.synthetic_batch_size, device, length)
        if self.imitator is not None:
            logs["imitator"] = self._imitator_steps(x, m, s_pub, start_x_pub, start_m_pub)
        logs["generator"] = self.component_step("generator", lambda: self.generator_loss(s_pub))
        finite = {f"train/{k}_loss": v for k, v in logs.items() if torch.isfinite(v)}  # an empty Poisson batch: NaN
        self.log_dict(finite, on_step=False, on_epoch=True)
        return logs

    @torch.no_grad()
    def _fakes(self, x, m, s, start_x, start_m) -> tuple[Tensor, ...]:
        z = self.encoder(x, m)
        x_hat, m_hat = self.reconstruct(x, m, z)
        z_syn = self.generator(s)
        x_syn, m_syn = self.synthesize_with(self.decoder.body, z_syn, start_x, start_m, x.shape[1] - 1)
        x_imi, m_imi = x_syn, m_syn
        if self.imitator is not None:
            x_imi, m_imi = self.synthesize_with(self.imitator, z_syn, start_x, start_m, x.shape[1] - 1)
        return x_hat, m_hat, z, z_syn, x_syn, m_syn, x_imi, m_imi

    def _imitator_steps(self, x, m, s, start_x, start_m) -> Tensor:
        """Dec_i's optimizer steps of one iteration (:data:`IMITATOR_SCHEDULE`); returns the sum of their losses.

        Each step reads the same draws and targets and re-synthesizes through the current Dec_i."""
        draws = self._imitator_targets(x, m, s, start_x, start_m)
        total = torch.zeros((), device=x.device)
        for terms in IMITATOR_SCHEDULE[self.hparams.loss_form]:
            total = total + self.component_step("imitator", lambda terms=terms: self.imitator_loss(*draws, terms))
        return total

    def _imitator_targets(self, x, m, s, start_x, start_m) -> tuple[Tensor, Tensor, Tensor, list[losses.Record]]:
        """G's latents, start steps and Dec_i's targets (steps ``1..T``; the model's outputs without gradient). Under
        ``strict_dp`` (or on an empty batch) the only target is Dec's synthesis from the public draws; otherwise the
        thesis pairs real example ``i`` with draw ``i`` and adds Dec's reconstruction and the real record."""
        k = 0 if self.hparams.strict_dp else min(len(x), len(s))
        with torch.no_grad():
            z_syn = self.generator(s)
            x_syn, m_syn = self.synthesize_with(self.decoder.body, z_syn, start_x, start_m, x.shape[1] - 1)
            x_hat, m_hat = self.reconstruct(x[:k], m[:k], self.encoder(x[:k], m[:k])) if k else (x, m)
        if k == 0:
            return z_syn, start_x, start_m, [(x_syn[:, 1:], m_syn[:, 1:])]
        targets = [(x_syn[:k, 1:], m_syn[:k, 1:]), (x_hat[:, 1:], m_hat[:, 1:]), (x[:k, 1:], m[:k, 1:])]
        return z_syn[:k], start_x[:k], start_m[:k], targets

    # ------------------------------------------------------------------------------------------- release
    def release(self) -> ReleasedSynthesizer:
        """The released artifact: copies of {G, Dec_i, Dec.last} (or {G, Dec} without an imitator), nothing else."""
        hp = self.hparams
        embedding = self.decoder.body.embedding
        config = {key: hp[key] for key in ("num_features", "static_continuous", "max_steps", "d_model", "heads")}
        config |= {"static_groups": list(self.static_groups), "layers": hp.layers, "d_ff": hp.d_ff}
        config |= {"noise_size": hp.noise_size, "hidden": hp.critic_hidden}
        config |= {"time_embedding": embedding.time is not None, "static_embedding": embedding.static is not None}
        if hp.latent != "pooled":  # a pooled release's config stays as it was before the option existed
            config["latent"] = hp.latent
        release = ReleasedSynthesizer(config, self.ehr_schema)
        body = self.imitator if self.imitator is not None else self.decoder.body
        release.generator.load_state_dict(self.generator.state_dict())
        release.body.load_state_dict(body.state_dict())
        release.last.load_state_dict(self.decoder.last.state_dict())
        return release.to(self.device)

    @torch.no_grad()
    def synthesize(
        self, n: int, steps: int | None = None, generator: torch.Generator | None = None, mask: str = "bernoulli"
    ) -> tuple[Tensor, Tensor]:
        """``n`` records from the module itself (same draws and order as :meth:`ReleasedSynthesizer.sample`)."""
        hp = self.hparams
        steps = hp.max_steps if steps is None else steps
        noise = torch.randn(self.generator.noise_shape(n, 1 + steps), generator=generator).to(self.device)
        start_x, start_m = sample_start(n, hp.num_features, hp.static_continuous, self.static_groups, generator)
        body = self.imitator if self.imitator is not None else self.decoder.body
        z = self.generator(noise)
        x, m = self.synthesize_with(body, z, start_x.to(self.device), start_m.to(self.device), steps)
        return assemble(x, m, generator, mask)
