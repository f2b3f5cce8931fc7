"""The layout of a preprocessed EHR tensor, its scalers (public by default) and the privacy unit of its records.

A preprocessed EHR record is a pair ``(x, m)`` of float tensors of shape ``[num_steps + 1, F]`` (Tang, "Deep Learning
with Differential Privacy and Adversarial Robustness", PhD thesis, Emory University 2021, section 4.3.2): step 0 holds
the static ("start") features, min-max scaled or one-hot, zero-padded to ``F`` slots; steps ``1..num_steps`` hold the
temporal features, feature :attr:`EHRSchema.time_feature` (0) being the min-max scaled increment of the measurement
time (0 at the first step). ``m`` is 1 where a value was observed and 0 where it is missing or padding, and ``x`` is 0
wherever ``m`` is 0.

Scaling is part of the privacy mechanism (docs/design.md, contract 12): a range read from the private training records
makes every record's tensor depend on every other record (one extreme record rescales them all), which no DP-SGD
clipping covers. :data:`SCALINGS` names the two ways a range is chosen; :attr:`EHRSchema.data_derived` records which
ranges (and categories) were read from the training records, so a trainer can refuse them or mark its epsilon nominal.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

SCALINGS = ("public", "train")
"""``"public"``: every range is declared (the source's or the caller's), independent of the records, so adding or
removing a record changes no other record's tensor. ``"train"``: a feature without a declared range is scaled with the
training split's min/max (the thesis, section 4.3.2): that reads private data and no DP guarantee covers it."""


def check_scaling(scaling: str) -> str:
    """``scaling`` if it is one of :data:`SCALINGS`, else a one-line ``ValueError`` saying what to pass."""
    if scaling not in SCALINGS:
        raise ValueError(f"scaling={scaling!r} is not one of {SCALINGS}: pass scaling='public' (declared ranges)")
    return scaling


def scale(values: np.ndarray, low: float | np.ndarray, high: float | np.ndarray) -> np.ndarray:
    """Min-max scale ``values`` with the range ``[low, high]``, clipped to ``[0, 1]`` (0 when ``high == low``).

    Values outside the range (beyond a declared range, or a validation or test record beyond the training set's
    extremes) are clipped, so every scaled value lies in ``[0, 1]`` (docs/design.md, contract 1). NaN stays NaN.
    """
    span = np.where(np.greater(high, low), np.subtract(high, low), 1.0)
    return np.clip((values - low) / span, 0.0, 1.0)


def unscale(values: Tensor, low: float | Tensor, high: float | Tensor) -> Tensor:
    """The inverse of :func:`scale` inside ``[low, high]``: ``low + values * (high - low)``."""
    return low + values * (high - low)


@dataclass(frozen=True)
class StaticField:
    """One static feature in step 0: a continuous value in one slot, or a one-hot group of ``len(categories)`` slots.

    Args:
        name: the feature's name (``"age"``, ``"gender"``).
        start: its first slot in step 0.
        categories: the categories of a one-hot group, in slot order; empty for a continuous feature.
        low: the scaler's 0 of a continuous feature (its declared lower end, or with ``scaling="train"`` the training
            set's minimum).
        high: the scaler's 1 of a continuous feature (declared upper end, or the training set's maximum).
    """

    name: str
    start: int
    categories: tuple[str, ...] = ()
    low: float = 0.0
    high: float = 1.0

    @property
    def is_continuous(self) -> bool:
        return not self.categories

    @property
    def slots(self) -> range:
        """The slots of step 0 this field occupies."""
        return range(self.start, self.start + max(1, len(self.categories)))


@dataclass(frozen=True)
class EHRSchema:
    """What each slot of a preprocessed EHR tensor means, the scalers that undo the preprocessing, and what one
    record is for privacy.

    Args:
        feature_names: the ``F`` temporal features, in order; ``feature_names[time_feature]`` is the time increment.
        static: the static fields of step 0, in slot order; slots after the last field are zero padding.
        temporal_low: the scaler's 0 of each temporal feature (raw units; time: of the increments).
        temporal_high: the scaler's 1 of each temporal feature.
        num_steps: the number of temporal steps (records are zero-padded or truncated to it).
        time_feature: the index of the time-increment feature.
        time_unit: the unit of raw times and increments (e.g. ``"hours"``).
        data_derived: the features whose range (or, for a discrete static feature, whose categories) were read from
            the training records; empty when the schema is independent of the data (``scaling="public"``).
        privacy_unit: what one record is, i.e. what a DP guarantee on these tensors protects (e.g. ``"per ED
            stay"``: a patient with ``k`` stays is covered only at group size ``k``).

    With ``data_derived`` empty the scalers are public: a record's tensor is a function of that record alone. Otherwise
    they are statistics of the training split (never of the validation or test split) that are not differentially
    private: every training tensor depends on the extremes of the others, and whoever publishes the schema with a
    model publishes those extremes.
    """

    feature_names: tuple[str, ...]
    static: tuple[StaticField, ...]
    temporal_low: tuple[float, ...]
    temporal_high: tuple[float, ...]
    num_steps: int = 50
    time_feature: int = 0
    time_unit: str = "hours"
    data_derived: tuple[str, ...] = ()
    privacy_unit: str = "per record"

    def __post_init__(self) -> None:
        width = self.num_features
        if not (len(self.temporal_low) == len(self.temporal_high) == width):
            raise ValueError(f"EHRSchema: {width} features but {len(self.temporal_low)} scaler entries")
        used = sum(len(field.slots) for field in self.static)
        if used > width:
            raise ValueError(
                f"the static features need {used} slots of step 0 but a step has only {width} features: drop static "
                "features or merge categories"
            )

    @property
    def public_scaling(self) -> bool:
        """Whether nothing in this schema was read from the records (see :attr:`data_derived`)."""
        return not self.data_derived

    @property
    def num_features(self) -> int:
        """``F``: the width of every step."""
        return len(self.feature_names)

    @property
    def shape(self) -> tuple[int, int]:
        """The shape of one record's ``x`` and ``m``: ``(num_steps + 1, F)``."""
        return self.num_steps + 1, self.num_features

    @property
    def one_hot_groups(self) -> dict[str, range]:
        """The slots of each one-hot static group, by name (e.g. ``{"gender": range(2, 4)}``)."""
        return {field.name: field.slots for field in self.static if not field.is_continuous}

    @property
    def continuous_static(self) -> dict[str, int]:
        """The slot of each continuous static feature, by name."""
        return {field.name: field.start for field in self.static if field.is_continuous}

    def as_dict(self) -> dict[str, Any]:
        """This schema as plain lists, numbers and strings, e.g. for a checkpoint read with ``weights_only=True``."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EHRSchema:
        """The schema :meth:`as_dict` wrote (lists become tuples again).

        A dict written before :attr:`data_derived` was recorded comes from the training split's min/max: every scaled
        feature is then marked data-derived, and its privacy unit is unknown.
        """
        static = tuple(StaticField(**{**field, "categories": tuple(field["categories"])}) for field in data["static"])
        plain = {key: tuple(value) if isinstance(value, list) else value for key, value in data.items()}
        if "data_derived" not in plain:
            scaled = [*plain["feature_names"], *(field.name for field in static if field.is_continuous)]
            plain |= {"data_derived": tuple(scaled), "privacy_unit": "unknown (written before it was recorded)"}
        return cls(**{**plain, "static": static})

    def inverse_transform(self, x: Tensor, m: Tensor) -> Tensor:
        """``x`` (``[..., num_steps + 1, F]``) back in raw units, NaN where ``m`` is 0 (missing or padding).

        Temporal features (and the time increment) are unscaled with the schema's ranges; continuous static features
        in step 0 likewise; one-hot slots keep their 0/1 values. Values the scaler clipped come back as the range's
        ends.
        """
        if x.shape != m.shape or tuple(x.shape[-2:]) != self.shape:
            raise ValueError(f"inverse_transform needs x and m of shape [..., {self.shape[0]}, {self.shape[1]}]")
        raw = x.to(torch.float64).clone()
        low = torch.tensor(self.temporal_low, dtype=torch.float64)
        high = torch.tensor(self.temporal_high, dtype=torch.float64)
        raw[..., 1:, :] = unscale(raw[..., 1:, :], low, high)
        for field in self.static:
            if field.is_continuous:
                raw[..., 0, field.start] = unscale(raw[..., 0, field.start], field.low, field.high)
        return raw.masked_fill(m < 0.5, float("nan"))

    def sample_start(self, n: int, generator: torch.Generator | None = None) -> tuple[Tensor, Tensor]:
        """``n`` random start steps ``(x0, m0)`` of shape ``[n, F]``, drawn from the static features' ranges only.

        Continuous features are uniform in ``[0, 1]`` (the scaled range), each one-hot group gets a uniformly drawn
        category; every static slot is marked observed and the padding is 0 with mask 0. Uses no training record,
        only this schema (thesis section 4.2.6).
        """
        x0 = torch.zeros(n, self.num_features)
        m0 = torch.zeros(n, self.num_features)
        for field in self.static:
            slots = list(field.slots)
            m0[:, slots] = 1.0
            if field.is_continuous:
                x0[:, field.start] = torch.rand(n, generator=generator)
            else:
                pick = torch.randint(len(slots), (n,), generator=generator)
                x0[torch.arange(n), field.start + pick] = 1.0
        return x0, m0
