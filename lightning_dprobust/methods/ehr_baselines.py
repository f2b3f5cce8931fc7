"""The baselines IGAMT is compared with (Tang 2021, PhD thesis, Emory University, section 4.3.1), on EHR batches.

* :class:`EHRVAE`: variational autoencoder (Kingma and Welling 2014, arXiv 1312.6114).
* :class:`EHRGAN`: Wasserstein GAN with gradient penalty (Goodfellow et al. 2014, arXiv 1406.2661; Gulrajani et al.
  2017, arXiv 1704.00028).
* :class:`EHRVAEGAN`: VAE whose decoder is also the generator of a GAN (Larsen et al. 2016, arXiv 1512.09300).
* :class:`EHRAAE`: adversarial autoencoder, the code distribution matched to ``N(0, I)`` by a critic (Makhzani et al.
  2016, arXiv 1511.05644).
* :class:`EHRDAAE`: dual adversarial autoencoder, a latent GAN (G vs Enc's codes) plus a data critic on the decoded
  draws (Lee et al. 2020, "Generating sequential electronic health records using dual adversarial autoencoder",
  JAMIA 27(9)).

All of them share IGAMT's sequence modules (``models/ehr_transformer.py``, without the time and static embeddings)
and its synthesis: a latent map ``s ~ N(0, I) -> z`` (the :class:`Generator` MLP) feeding the causal decoder, which
generates autoregressively from start steps drawn from the static features' ranges. Their released artifact is
therefore the same :class:`~lightning_dprobust.models.ehr_release.ReleasedSynthesizer` {latent map, Dec body, Dec
last}, read by the same synthesis path as IGAMT's.

Privacy: the DP wiring of :class:`~lightning_dprobust.methods.generative_base.GenerativeDPModule`. Every component
except ``generator`` reads real data (critics see real records or their codes, the encoder and decoder reconstruct
them), so each of their updates is a per-example clipped, noised release, all of an iteration accounted as one event
in the one ledger. ``generator`` (GAN: latent map and decoder; DAAE: the latent map G) learns only through private
critics from public draws: post-processing. The epsilon covers the released artifact, per record (one patient on the
synthetic and CSV sources, **per ED stay** on MIMIC-IV-ED). The baselines have one wiring, always strict: a data module
whose scaling ranges were read from the private training records (``EHRDataModule(scaling="train")``) is refused at
fit setup (:class:`~lightning_dprobust.methods.ehr_module.EHRGenerativeModule`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from lightning_dprobust.methods import igamt_losses as losses
from lightning_dprobust.methods.ehr_module import EHRGenerativeModule, check_critic_schedule
from lightning_dprobust.models.ehr_baselines import CodeEncoder, data_and_mask, gaussian_kl
from lightning_dprobust.models.ehr_release import ReleasedSynthesizer
from lightning_dprobust.models.ehr_transformer import (
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

PUBLIC = "generator"


class EHRBaseline(EHRGenerativeModule):
    """Shared body of the EHR baselines; a subclass picks its parts through three class attributes.

    * ``encoder_kind``: ``None`` (no encoder), ``"variational"`` (Gaussian code, KL to ``N(0, I)``),
      ``"deterministic"`` (the code's mean) or ``"latent"`` (Enc's pooled state is the decoder's ``z`` directly).
    * ``data_critic``: a WGAN-GP critic on ``[x m, m]`` against the reconstructions and the decoded draws.
    * ``latent_critic``: ``"prior"`` (codes vs ``N(0, I)`` draws, AAE) or ``"generator"`` (Enc's ``z`` vs
      ``G(s)``, DAAE).

    Training, per batch: when ``t % critic_freq_base < critic_freq_hit`` the critics take one step, then the
    encoder, the decoder and the public generator, each with its own Adam (``lr``; ``critic_lr`` for the critics).

    Args:
        num_features, static_continuous, static_groups, max_steps, d_model, heads, layers, d_ff, noise_size,
            critic_hidden, gp_weight, recon_weight, critic_freq_base, critic_freq_hit, lr, critic_lr,
            synthetic_batch_size: as :class:`~lightning_dprobust.methods.igamt.IGAMT`.
        kl_weight: weight of the KL term (variational encoders).
        **dp_kwargs: see :class:`GenerativeDPModule` (``noise_multiplier``, ``max_grad_norm``, ``clip_mode``, ...).
    """

    name: ClassVar[str] = ""
    encoder_kind: ClassVar[str | None] = None
    data_critic: ClassVar[bool] = False
    latent_critic: ClassVar[str | None] = None

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
        gp_weight: float = 10.0,
        recon_weight: float = 10.0,
        kl_weight: float = 1.0,
        critic_freq_base: int = 5,
        critic_freq_hit: int = 1,
        lr: float = 5e-4,
        critic_lr: float = 1e-4,
        synthetic_batch_size: int = 32,
        **dp_kwargs: Any,
    ) -> None:
        super().__init__(**dp_kwargs)
        check_critic_schedule(critic_freq_base, critic_freq_hit)
        self.save_hyperparameters()
        self.static_groups = tuple(int(g) for g in static_groups)
        num_static = static_slots(static_continuous, self.static_groups, num_features)
        sizes = (d_model, heads, d_ff, layers)

        def embedding() -> StepEmbedding:
            return StepEmbedding(num_features, d_model, max_steps, num_static, time=False, static=False)

        self.latent_map = Generator(noise_size, d_model, critic_hidden)
        self.decoder = EHRDecoder(DecoderBody(embedding(), *sizes), OutputHeads(d_model, num_features))
        self.encoder: nn.Module | None = None
        if self.encoder_kind == "latent":
            self.encoder = EHREncoder(embedding(), *sizes)
        elif self.encoder_kind is not None:
            self.encoder = CodeEncoder(EHREncoder(embedding(), *sizes), d_model, noise_size)
        self.critic_x = SequenceCritic(2 * num_features, critic_hidden) if self.data_critic else None
        code_size = noise_size if self.latent_critic == "prior" else d_model
        self.critic_z = LatentCritic(code_size, critic_hidden) if self.latent_critic else None

    # ------------------------------------------------------------------------------------------- components
    def component_modules(self) -> dict[str, list[nn.Module]]:
        parts: dict[str, list[nn.Module]] = {}
        critics = [c for c in (self.critic_x, self.critic_z) if c is not None]
        if critics:
            parts["critics"] = critics
        if self.encoder is None:
            return parts | {PUBLIC: [self.latent_map, self.decoder]}
        parts["encoder"] = [self.encoder]
        if self.latent_critic == "generator":
            return parts | {"decoder": [self.decoder], PUBLIC: [self.latent_map]}
        return parts | {"decoder": [self.latent_map, self.decoder]}

    def private_components(self) -> frozenset[str]:
        """Every component but ``generator``: critics, encoder and decoder read real data (see module doc)."""
        return frozenset(self.component_modules()) - {PUBLIC}

    def learning_rates(self) -> dict[str, float]:
        hp = self.hparams
        return {name: hp.critic_lr if name == "critics" else hp.lr for name in self.component_modules()}

    # ------------------------------------------------------------------------------------------- forward parts
    def encode(self, x: Tensor, m: Tensor, eps: Tensor) -> tuple[Tensor, Tensor]:
        """``(code, kl)``: the code of each record (reparametrized with ``eps`` when variational) and its KL."""
        if self.encoder_kind == "latent":
            z = self.encoder(x, m)
            return z, torch.zeros_like(z[:, 0])
        mu, logvar = self.encoder(x, m)
        if self.encoder_kind == "variational":
            return mu + (0.5 * logvar).exp() * eps, gaussian_kl(mu, logvar)
        return mu, torch.zeros_like(mu[:, 0])

    def reconstruct(self, x: Tensor, m: Tensor, code: Tensor) -> tuple[Tensor, Tensor]:
        """Teacher-forced Dec from ``code``: steps ``0..T-1`` -> ``(x^, m^)`` of ``1..T``, real step 0 prepended."""
        z = code if self.encoder_kind == "latent" else self.latent_map(code)
        x_hat, m_hat = self.decoder(x[:, :-1], m[:, :-1], z)
        return torch.cat([x[:, :1], x_hat], dim=1), torch.cat([m[:, :1], m_hat], dim=1)

    def synthesize_from(self, s: Tensor, start_x: Tensor, start_m: Tensor, steps: int) -> tuple[Tensor, Tensor]:
        """Autoregressive synthesis of ``steps`` steps from the draws ``s`` (soft values, as the critics see them)."""
        return generate(self.decoder.body, self.decoder.last, self.latent_map(s), start_x, start_m, steps)

    def draws(self, n: int, device: torch.device) -> tuple[Tensor, Tensor, Tensor]:
        """Latent draws ``s`` and start steps for ``n`` synthetic records (public randomness: no real data)."""
        hp = self.hparams
        start_x, start_m = sample_start(n, hp.num_features, hp.static_continuous, self.static_groups)
        return torch.randn(n, hp.noise_size, device=device), start_x.to(device), start_m.to(device)

    # ------------------------------------------------------------------------------------------- losses
    def _recon(self, x: Tensor, m: Tensor, x_hat: Tensor, m_hat: Tensor) -> Tensor:
        return self.hparams.recon_weight * losses.reconstruction(x[:, 1:], m[:, 1:], x_hat[:, 1:], m_hat[:, 1:])

    def encoder_loss(self, x: Tensor, m: Tensor, eps: Tensor) -> Tensor:
        """Reconstruction (+ ``kl_weight`` KL) (AAE: ``- D_z(code)``; DAAE, as IGAMT's Eq 4.4: ``+ D_z(z)``)."""
        code, kl = self.encode(x, m, eps)
        loss = self._recon(x, m, *self.reconstruct(x, m, code)) + self.hparams.kl_weight * kl
        if self.latent_critic == "prior":
            loss = loss - self.critic_z(code)
        elif self.latent_critic == "generator":
            loss = loss + self.critic_z(code)
        return loss

    def decoder_loss(self, x: Tensor, m: Tensor, eps: Tensor, s: Tensor, start_x: Tensor, start_m: Tensor) -> Tensor:
        """Reconstruction from the (fixed) code (with a data critic: ``- D_x(x^, m^) - D_x(x~, m~)``)."""
        code = self.encode(x, m, eps)[0].detach()
        x_hat, m_hat = self.reconstruct(x, m, code)
        loss = self._recon(x, m, x_hat, m_hat)
        if self.critic_x is not None:
            x_syn, m_syn = self.synthesize_from(s, start_x, start_m, x.shape[1] - 1)
            fakes = [self.critic_x(data_and_mask(x_hat, m_hat)), self.critic_x(data_and_mask(x_syn, m_syn))]
            loss = loss + losses.decoder_adversarial(fakes)
        return loss

    def critics_loss(self, x: Tensor, m: Tensor, alpha: Tensor, real_code: Tensor, fake_code: Tensor, *fakes) -> Tensor:
        """WGAN-GP losses (Eq 4.1 form, real weight = number of fakes) of the data critic against ``fakes`` (pairs
        ``x, m``) and of the latent critic, ``real_code`` vs ``fake_code``; per example."""
        hp, loss = self.hparams, torch.zeros_like(x[:, 0, 0])
        if self.critic_x is not None:
            real = data_and_mask(x, m)
            inputs = [data_and_mask(a, b) for a, b in zip(fakes[::2], fakes[1::2], strict=True)]
            loss = loss + losses.critic_loss(self.critic_x(real), [self.critic_x(f) for f in inputs])
            for fake in inputs:
                loss = loss + hp.gp_weight * losses.gradient_penalty(self.critic_x, real, fake, alpha)
        if self.critic_z is not None:
            loss = loss + losses.critic_loss(self.critic_z(real_code), [self.critic_z(fake_code)])
            loss = loss + hp.gp_weight * losses.gradient_penalty(self.critic_z, real_code, fake_code, alpha)
        return loss

    def generator_loss(self, s: Tensor, start_x: Tensor, start_m: Tensor, steps: int) -> Tensor:
        """The public update: DAAE's G ``-D_z(G(s))``; GAN's generator ``-D_x(x~, m~)``."""
        if self.latent_critic == "generator":
            return -self.critic_z(self.latent_map(s)).mean()
        return -self.critic_x(data_and_mask(*self.synthesize_from(s, start_x, start_m, steps))).mean()

    # ------------------------------------------------------------------------------------------- training
    def train_iteration(self, x: Tensor, m: Tensor, iteration: int) -> dict[str, Tensor]:
        """One iteration on a batch; returns the mean loss of each component updated."""
        n, device, steps = x.shape[0], x.device, x.shape[1] - 1
        eps = torch.randn(n, self.hparams.noise_size, device=device)
        s, start_x, start_m = self.draws(n, device)
        parts, logs = self.component_modules(), {}
        if "critics" in parts and self.critics_scheduled(iteration):
            fakes = self._fakes(x, m, eps, s, start_x, start_m)
            logs["critics"] = self.component_step("critics", "critics_loss", (x, m, torch.rand(n), *fakes))
        if "encoder" in parts:
            logs["encoder"] = self.component_step("encoder", "encoder_loss", (x, m, eps))
        if "decoder" in parts:
            logs["decoder"] = self.component_step("decoder", "decoder_loss", (x, m, eps, s, start_x, start_m))
        if PUBLIC in parts:
            public = self.draws(self.hparams.synthetic_batch_size, device)
            logs[PUBLIC] = self.component_step(PUBLIC, lambda: self.generator_loss(*public, steps))
        self.log_dict({f"train/{k}_loss": v for k, v in logs.items()}, on_step=False, on_epoch=True)
        return logs

    @torch.no_grad()
    def _fakes(self, x, m, eps, s, start_x, start_m) -> tuple[Tensor, ...]:
        """``(real_code, fake_code, x_a, m_a, ...)`` for :meth:`critics_loss`, example ``i`` paired with draw ``i``."""
        n, fakes = x.shape[0], []
        code = self.encode(x, m, eps)[0] if self.encoder is not None else None
        if self.critic_x is not None:
            if code is not None:
                fakes += self.reconstruct(x, m, code)
            fakes += self.synthesize_from(s, start_x, start_m, x.shape[1] - 1)
        if self.latent_critic == "prior":
            return (torch.randn_like(code), code, *fakes)
        if self.latent_critic == "generator":
            return (code, self.latent_map(s), *fakes)
        return (x.new_zeros(n, 1), x.new_zeros(n, 1), *fakes)

    # ------------------------------------------------------------------------------------------- release
    def release(self) -> ReleasedSynthesizer:
        """The released artifact: copies of {latent map, Dec body, Dec last}; no encoder, no critic."""
        hp = self.hparams
        config = {key: hp[key] for key in ("num_features", "static_continuous", "max_steps", "d_model", "heads")}
        config |= {"static_groups": list(self.static_groups), "layers": hp.layers, "d_ff": hp.d_ff}
        config |= {"noise_size": hp.noise_size, "hidden": hp.critic_hidden}
        config |= {"time_embedding": False, "static_embedding": False}
        release = ReleasedSynthesizer(config, self.ehr_schema)
        release.generator.load_state_dict(self.latent_map.state_dict())
        release.body.load_state_dict(self.decoder.body.state_dict())
        release.last.load_state_dict(self.decoder.last.state_dict())
        return release.to(self.device)

    @torch.no_grad()
    def synthesize(self, n: int, steps: int | None = None, generator: torch.Generator | None = None):
        """``n`` records ``(x, m)`` through the released artifact (the only synthesis path)."""
        return self.release().sample(n, steps, generator)

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        super().on_save_checkpoint(checkpoint)
        checkpoint["ehr_baseline"] = self.name


class EHRVAE(EHRBaseline):
    """VAE (Kingma and Welling 2014): private encoder and decoder; synthesis decodes ``s ~ N(0, I)``."""

    name = "vae"
    encoder_kind = "variational"


class EHRGAN(EHRBaseline):
    """WGAN-GP (Gulrajani et al. 2017): private data critic; the generator (latent map + decoder) is public."""

    name = "gan"
    data_critic = True


class EHRVAEGAN(EHRBaseline):
    """VAE-GAN (Larsen et al. 2016): a VAE whose decoder also fools a data critic; all three parts private."""

    name = "vae_gan"
    encoder_kind = "variational"
    data_critic = True


class EHRAAE(EHRBaseline):
    """AAE (Makhzani et al. 2016): deterministic codes matched to ``N(0, I)`` by a private latent critic."""

    name = "aae"
    encoder_kind = "deterministic"
    latent_critic = "prior"


class EHRDAAE(EHRBaseline):
    """DAAE (Lee et al. 2020): G learns Enc's code distribution (latent critic), the decoder fools a data critic on
    reconstructions and decoded ``G(s)``; G is public."""

    name = "daae"
    encoder_kind = "latent"
    data_critic = True
    latent_critic = "generator"


BASELINES: dict[str, type[EHRBaseline]] = {cls.name: cls for cls in (EHRVAE, EHRGAN, EHRVAEGAN, EHRAAE, EHRDAAE)}
"""The baselines of thesis Table 4.1 by name."""
