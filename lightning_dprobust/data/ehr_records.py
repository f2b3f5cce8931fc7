"""Raw EHR records and the thesis's preprocessing that turns them into ``(x, m)`` tensors (section 4.3.2 of Tang,
"Deep Learning with Differential Privacy and Adversarial Robustness", PhD thesis, Emory University 2021).

Every reader (synthetic generator, long-format CSV, MIMIC-IV-ED) produces :class:`RawRecord` objects; one function
sets the scalers (:func:`fit_schema`: declared public ranges by default, the training records' min/max only when
asked) and one turns any records into tensors with them (:func:`encode`), so all sources are preprocessed
identically.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial

import numpy as np
import torch
from torch import Tensor

from lightning_dprobust.data.ehr_schema import EHRSchema, StaticField, check_scaling, scale


@dataclass
class RawRecord:
    """One patient record (an ED stay, an admission) in raw units.

    Args:
        group: who the record belongs to (the patient); splits never put one group in two splits.
        times: measurement times, non-decreasing, shape ``[T]`` (e.g. hours since admission).
        values: temporal medical features, shape ``[T, F - 1]``, NaN where missing.
        static: static features by name: a number for a continuous one, a category string for a discrete one,
            ``None`` (or NaN) when missing.
    """

    group: str
    times: np.ndarray
    values: np.ndarray
    static: dict[str, float | str | None] = field(default_factory=dict)


def _present(value: float | str | None) -> bool:
    return value is not None and not (isinstance(value, float) and math.isnan(value))


def _range(
    values: Callable[[], np.ndarray], name: str, ranges: Mapping[str, tuple[float, float]], scaling: str
) -> tuple[float, float]:
    """The declared range of ``name``; with ``scaling="train"`` and none declared, the min and max of the training
    ``values()`` (NaN ignored), which are read only then."""
    if name in ranges:
        low, high = ranges[name]
        if not high > low:
            raise ValueError(f"ranges['{name}'] = ({low}, {high}): the upper end must exceed the lower one")
        return float(low), float(high)
    if scaling == "public":
        raise ValueError(
            f"feature '{name}' has no declared range, and scaling='public' never reads one from the private records: "
            f"pass ranges={{'{name}': (low, high)}} from public knowledge"
        )
    finite = (column := values())[~np.isnan(column)]
    if not len(finite):
        raise ValueError(f"feature '{name}' is never observed in the training split: drop it or give its range")
    return float(finite.min()), float(finite.max())


def _categories(train: Sequence[RawRecord], name: str, categories: Sequence[str] | None, scaling: str) -> list[str]:
    """The declared ``categories`` of ``name``; with ``scaling="train"`` and none declared, those seen in ``train``."""
    if categories is None and scaling == "public":
        raise ValueError(
            f"static feature '{name}' has no declared categories, and scaling='public' never reads them from the "
            f"private records: pass categories={{'{name}': [...]}}"
        )
    if categories is None:
        categories = sorted({str(r.static[name]) for r in train if _present(r.static.get(name))})
    if not categories:
        raise ValueError(f"static feature '{name}' is never observed in the training split: drop it")
    return [str(c) for c in categories]


def increments(times: np.ndarray) -> np.ndarray:
    """Time increments between neighbouring steps, with 0 as the first increment."""
    return np.diff(np.asarray(times, dtype=np.float64), prepend=times[0] if len(times) else 0.0)


def fit_schema(
    train: Sequence[RawRecord],
    medical: Sequence[str],
    continuous: Sequence[str] = (),
    categorical: Mapping[str, Sequence[str] | None] | None = None,
    num_steps: int = 50,
    ranges: Mapping[str, tuple[float, float]] | None = None,
    time_unit: str = "hours",
    scaling: str = "public",
    privacy_unit: str = "per record",
) -> EHRSchema:
    """Lay out step 0 and set the min-max scalers: declared ranges, or the **training** records' min/max.

    Guarantee: with ``scaling="public"`` the schema is a function of the arguments other than ``train`` (which is
    then only checked, never read for a statistic), so adding or removing a training record changes no other record's
    tensor. With ``scaling="train"`` it is not: the records' extremes and categories enter every tensor, and
    :attr:`EHRSchema.data_derived` names the features concerned.

    Args:
        train: the training records (truncated to ``num_steps`` before the statistics are taken).
        medical: names of the ``F - 1`` temporal medical features, in the column order of ``values``.
        continuous: static features min-max scaled into one slot each (first in step 0).
        categorical: static features one-hot encoded, with their declared categories; ``None`` (only with
            ``scaling="train"``) takes the categories seen in the training records, sorted.
        num_steps: temporal steps per record.
        ranges: declared ``(low, high)`` ranges by feature name (``"time_increment"`` for the time feature); with
            ``scaling="public"`` every scaled feature needs one. Values outside a range are clipped to its ends.
        time_unit: the unit of ``times``.
        scaling: ``"public"`` (declared ranges and categories only) or ``"train"`` (the thesis: the training
            records' min/max and categories where none is declared; not covered by any DP guarantee).
        privacy_unit: what one record is (:attr:`EHRSchema.privacy_unit`).

    Raises:
        ValueError: a declared range is empty or names no feature; with ``scaling="public"``, a scaled feature
            without a range or a discrete one without categories (the message says what to pass).
    """
    ranges = dict(ranges or {})
    check_scaling(scaling)
    names = ("time_increment", *medical)
    unknown = sorted(set(ranges) - set(names) - set(continuous))
    if unknown:
        raise ValueError(
            f"ranges for {unknown}: not a feature of this data; give ranges of {', '.join((*names, *continuous))}"
        )
    cut = [(record.times[:num_steps], record.values[:num_steps]) for record in train]
    bounds = [_range(partial(_temporal_column, cut, j), name, ranges, scaling) for j, name in enumerate(names)]
    fields, slot = [], 0
    for name in continuous:
        low, high = _range(partial(_static_column, train, name), name, ranges, scaling)
        fields.append(StaticField(name, slot, low=low, high=high))
        slot += 1
    for name, categories in (categorical or {}).items():
        chosen = _categories(train, name, categories, scaling)
        fields.append(StaticField(name, slot, categories=tuple(chosen)))
        slot += len(chosen)
    derived = [name for name in (*names, *continuous) if name not in ranges]
    derived += [name for name, categories in (categorical or {}).items() if categories is None]
    return EHRSchema(
        feature_names=names,
        static=tuple(fields),
        temporal_low=tuple(low for low, _ in bounds),
        temporal_high=tuple(high for _, high in bounds),
        num_steps=num_steps,
        time_unit=time_unit,
        data_derived=tuple(derived),
        privacy_unit=privacy_unit,
    )


def _temporal_column(cut: Sequence[tuple[np.ndarray, np.ndarray]], j: int) -> np.ndarray:
    """Temporal feature ``j`` (0: the time increment) of every (truncated) training record, concatenated."""
    if j == 0:
        return np.concatenate([increments(times) for times, _ in cut])
    return np.concatenate([values[:, j - 1] for _, values in cut])


def _static_column(train: Sequence[RawRecord], name: str) -> np.ndarray:
    """The continuous static feature ``name`` of every training record (NaN where missing)."""
    seen = [float(r.static[name]) if _present(r.static.get(name)) else math.nan for r in train]
    return np.array(seen, dtype=np.float64)


def encode_record(record: RawRecord, schema: EHRSchema) -> tuple[np.ndarray, np.ndarray]:
    """One record as ``(x, m)`` arrays of shape ``[num_steps + 1, F]`` (float32), preprocessed with ``schema``.

    Step 0: continuous static features scaled, one-hot groups set (an unseen or missing category leaves the whole
    group 0 with mask 0), zero padding with mask 0. Steps ``1..T``: the scaled time increment (mask 1) and the scaled
    medical features (mask 0 and value 0 where NaN). Steps after the record's end (or after ``num_steps``, which
    truncates it) are zero with mask 0.
    """
    x = np.zeros(schema.shape, dtype=np.float32)
    m = np.zeros(schema.shape, dtype=np.float32)
    for fld in schema.static:
        value = record.static.get(fld.name)
        if not _present(value):
            continue
        if fld.is_continuous:
            x[0, fld.start], m[0, fld.start] = scale(np.float64(value), fld.low, fld.high), 1.0
        elif str(value) in fld.categories:
            x[0, fld.start + fld.categories.index(str(value))] = 1.0
            m[0, list(fld.slots)] = 1.0
    times, values = record.times[: schema.num_steps], record.values[: schema.num_steps]
    steps = np.column_stack([increments(times), values]) if len(times) else np.zeros((0, schema.num_features))
    if steps.shape[1] != schema.num_features:
        raise ValueError(
            f"record '{record.group}' has {steps.shape[1] - 1} medical features, expected F - 1 = "
            f"{schema.num_features - 1} ({', '.join(schema.feature_names[1:])})"
        )
    observed = ~np.isnan(steps)
    scaled = scale(steps, np.array(schema.temporal_low), np.array(schema.temporal_high))
    x[1 : len(steps) + 1] = np.where(observed, scaled, 0.0)
    m[1 : len(steps) + 1] = observed
    return x, m


def encode(records: Sequence[RawRecord], schema: EHRSchema) -> tuple[Tensor, Tensor]:
    """All ``records`` as ``x, m`` tensors of shape ``[N, num_steps + 1, F]`` (see :func:`encode_record`)."""
    x = np.zeros((len(records), *schema.shape), dtype=np.float32)
    m = np.zeros_like(x)
    for i, record in enumerate(records):
        x[i], m[i] = encode_record(record, schema)
    return torch.from_numpy(x), torch.from_numpy(m)


def decode(x: Tensor, m: Tensor, schema: EHRSchema, groups: Sequence[str] | None = None) -> list[RawRecord]:
    """Tensors (real or synthetic) back to :class:`RawRecord` objects in raw units: the inverse of :func:`encode`.

    A step belongs to the record when its time feature is observed (``m >= 0.5``); times are the running sum of the
    unscaled increments, starting at 0. One-hot groups decode to their largest slot's category.
    """
    raw = schema.inverse_transform(x, m).numpy()
    observed = (m >= 0.5).numpy()
    records = []
    for i in range(len(raw)):
        steps = np.flatnonzero(observed[i, 1:, schema.time_feature]) + 1
        static: dict[str, float | str | None] = {}
        for fld in schema.static:
            slots = list(fld.slots)
            if not observed[i, 0, slots].all():
                static[fld.name] = None
            elif fld.is_continuous:
                static[fld.name] = float(raw[i, 0, fld.start])
            else:
                static[fld.name] = fld.categories[int(np.argmax(x[i, 0, slots].numpy()))]
        temporal = raw[i, steps]
        group = groups[i] if groups is not None else str(i)
        records.append(RawRecord(group, np.cumsum(temporal[:, schema.time_feature]), temporal[:, 1:], static))
    return records
