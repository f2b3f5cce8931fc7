"""What every EHR generative module (IGAMT and its baselines) shares besides its networks: the data schema and the
iteration counter (both carried by checkpoints), the scaling check and privacy-unit report, the critic schedule of
IGAMT's Algorithm 1 and the batch check."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from lightning.pytorch.utilities import rank_zero_info
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from torch import Tensor

from lightning_dprobust.data.ehr_schema import EHRSchema
from lightning_dprobust.methods.generative_base import GenerativeDPModule


class EHRGenerativeModule(GenerativeDPModule):
    """A :class:`GenerativeDPModule` trained on EHR tensors.

    ``ehr_schema``: the training data module's ``schema`` as a plain dict, taken at fit setup and written to
    checkpoints, so that a release can report synthetic records in raw units; it carries the scaling ranges, which of
    them were read from the training records (``data_derived``) and the privacy unit. ``iteration``: the
    training-iteration counter the critic schedule reads; checkpointed, so a resumed run keeps the schedule of an
    unbroken one.

    Scaling is part of the mechanism (design, contract 12). With DP, a schema whose ranges or categories were read
    from the training records (``EHRDataModule(scaling="train")``) is refused at fit setup when :attr:`strict_dp` is
    set, and otherwise makes the epsilon **nominal** (:meth:`nominal_reason`): it excludes the cost of that scaling.
    The check reads the data module's ``schema``; tensors passed without a data module that has one are assumed to
    be scaled with public ranges. The privacy unit (one record: one patient, or per ED stay on MIMIC-IV-ED) is printed
    with the DP settings at train start.

    A subclass has the hyperparameters ``num_features``, ``max_steps``, ``critic_freq_base`` and ``critic_freq_hit``
    (checked by :func:`check_critic_schedule`) and implements :meth:`train_iteration`.
    """

    def __init__(self, **dp_kwargs: Any) -> None:
        super().__init__(**dp_kwargs)
        self.ehr_schema: dict[str, Any] | None = None
        self.iteration = 0

    @property
    def strict_dp(self) -> bool:
        """Whether only a guarantee is acceptable: the ``strict_dp`` hyperparameter, ``True`` for modules without it."""
        return bool(self.hparams.get("strict_dp", True))

    def setup(self, stage: str) -> None:
        if stage == "fit":
            self._take_schema()
        super().setup(stage)

    def _take_schema(self) -> None:
        """Keep the data module's schema, after checking its layout and, with DP and :attr:`strict_dp`, its scaling."""
        datamodule = self.trainer.datamodule
        schema = getattr(datamodule, "schema", None) if datamodule is not None else None
        if not dataclasses.is_dataclass(schema):
            return
        check_layout(type(self).__name__, self.hparams, schema)
        if self.dp_enabled and self.strict_dp and schema.data_derived:
            raise MisconfigurationException(
                f"{type(self).__name__}(strict_dp=True): the scaling of {list(schema.data_derived)} was read from the "
                "private training records, which no DP guarantee covers: use EHRDataModule(scaling='public') (declared "
                "ranges) or pass public ranges=... (and categories=...)"
            )
        self.ehr_schema = dataclasses.asdict(schema)

    def nominal_reason(self) -> str | None:
        reasons = [super().nominal_reason(), self.wiring_reason(), self.scaling_reason()]
        return "; ".join(reason for reason in reasons if reason) or None

    def wiring_reason(self) -> str | None:
        """Why the choice of private components leaves the epsilon nominal, or ``None`` (every one noised)."""
        return None

    def scaling_reason(self) -> str | None:
        """Why the data's scaling leaves the epsilon nominal (ranges read from the training records), or ``None``."""
        derived = (self.ehr_schema or {}).get("data_derived")
        if not derived:
            return None
        return (
            f"the scaling of {list(derived)} was read from the private training records (scaling='train'); "
            "the epsilon excludes that cost"
        )

    def on_train_start(self) -> None:
        super().on_train_start()
        if self.dp_enabled and self.ehr_schema is not None:
            scaling = "read from the training records (nominal)" if self.scaling_reason() else "declared, public"
            rank_zero_info(
                f"{type(self).__name__}: privacy unit {self.ehr_schema['privacy_unit']}; scaling ranges {scaling}"
            )

    def critics_scheduled(self, iteration: int) -> bool:
        """The critic schedule of IGAMT's Algorithm 1, line 11: ``t % fb < fh``."""
        return iteration % self.hparams.critic_freq_base < self.hparams.critic_freq_hit

    def training_step(self, batch: Sequence[Tensor], batch_idx: int) -> None:
        x, m = check_batch(type(self).__name__, batch, self.hparams.num_features, self.hparams.max_steps)
        self.train_iteration(x, m, self.iteration)
        self.iteration += 1

    def train_iteration(self, x: Tensor, m: Tensor, iteration: int) -> dict[str, Tensor]:
        """One training iteration on a batch; returns the mean loss of each component updated."""
        raise NotImplementedError

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        super().on_save_checkpoint(checkpoint)
        checkpoint["igamt_iteration"] = self.iteration
        if self.ehr_schema is not None:
            checkpoint["ehr_schema"] = self.ehr_schema

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        super().on_load_checkpoint(checkpoint)
        self.iteration = int(checkpoint.get("igamt_iteration", 0))
        self.ehr_schema = checkpoint.get("ehr_schema")


def check_critic_schedule(critic_freq_base: int, critic_freq_hit: int) -> None:
    """Refuse a critic schedule ``t % fb < fh`` outside ``0 < fh <= fb`` (``fh <= 0``: the critics never train)."""
    if not 0 < critic_freq_hit <= critic_freq_base:
        raise MisconfigurationException(
            f"need 0 < critic_freq_hit <= critic_freq_base, got {critic_freq_hit} and {critic_freq_base}"
        )


def check_batch(owner: str, batch: Sequence[Tensor], num_features: int, max_steps: int) -> tuple[Tensor, Tensor]:
    """``(x, m)`` of a batch of EHR tensors ``[B, 1 + T, F]``, or a one-line error naming what to set."""
    if not (isinstance(batch, list | tuple) and len(batch) == 2):
        raise ValueError(f"{owner} trains on batches (x, m) of EHR tensors [B, 1 + T, F]; got another batch structure")
    x, m = batch
    if x.dim() != 3 or x.shape != m.shape or x.shape[2] != num_features or not 2 <= x.shape[1] <= max_steps + 1:
        raise ValueError(
            f"{owner} needs x and m of equal shape [B, 1 + T, {num_features}] with 1 <= T <= {max_steps}; got "
            f"{tuple(x.shape)} and {tuple(m.shape)}: set num_features / max_steps to the data's"
        )
    return x, m


def check_layout(owner: str, hparams: Any, schema: EHRSchema) -> None:
    """Refuse, in one line, a model whose ``num_features`` / ``static_continuous`` / ``static_groups`` do not describe
    the data's step 0 (e.g. MIMIC-IV-ED without ``patients.csv`` has no age: 1 continuous static feature, not 2), or
    whose ``max_steps`` is shorter than the data's records: the static slots would be read as other features."""
    continuous = [field.name for field in schema.static if field.is_continuous]
    groups = tuple(len(field.categories) for field in schema.static if not field.is_continuous)
    model = (hparams.num_features, hparams.static_continuous, tuple(int(g) for g in hparams.static_groups))
    if model != (schema.num_features, len(continuous), groups) or hparams.max_steps < schema.num_steps:
        fields = ", ".join(f"{f.name} ({len(f.categories) or 'continuous'})" for f in schema.static) or "none"
        raise MisconfigurationException(
            f"{owner}(num_features={model[0]}, static_continuous={model[1]}, static_groups={list(model[2])}, "
            f"max_steps={hparams.max_steps}) does not fit the data: {schema.num_features} features, "
            f"{schema.num_steps} steps, static fields {fields}; set num_features={schema.num_features}, "
            f"static_continuous={len(continuous)}, static_groups={list(groups)}, max_steps >= {schema.num_steps}"
        )
