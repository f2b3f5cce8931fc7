"""An embedded synthetic EHR generator with known structure: the default EHR source, offline and a ground truth for
the synthetic-data metrics.

Each record is an emergency-department-like stay with the thesis's five characteristics (Tang, PhD thesis, Emory
University 2021, section 4.1): temporal features, static features, heterogeneous types, missing values and irregular
measurement times. The structure, all in :data:`STRUCTURE`, is:

* static features: ``start_time`` (day of the year, uniform in [0, 365)), ``age`` (uniform in [18, 90)), ``gender``
  (``F``/``M``, equally likely) and ``race`` (``white``/``black``/``other`` with probabilities 0.6/0.25/0.15);
* irregular sampling: the first measurement at time 0, then gaps (hours) drawn from a Gamma distribution with shape
  2 whose mean grows from 0.5 h (age 90) to 2.5 h (age 18): older patients are measured more often;
* a record length uniform in ``[min_steps, max_steps]`` (so some records are padded and some truncated to 50);
* feature ``j`` at time ``t`` (hours): ``base_j + age_j * (age - 54) / 36 + gender_j * [M] + race_j[race]
  + trend_j * t / 24 + daily_j * sin(2 pi (t / 24 + frac(start_time))) + yearly_j * cos(2 pi start_time / 365)
  + noise_j * (record intercept + step noise)``, both noises standard normal: static features shift the
  trajectories, with a trend, a daily and a yearly seasonal component;
* feature-dependent missingness: value ``j`` is missing with probability ``sigmoid(logit(missing_j) + mnar_j * z)``,
  ``z`` being its standardized deviation from the record's mean, so missingness differs by feature and depends on
  the value itself (missing not at random).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from lightning_dprobust.data.ehr_records import RawRecord

MEDICAL = ("temperature", "resprate", "o2sat", "heartrate", "pain", "dbp", "sbp", "acuity")
"""The temporal medical features, named and ordered like the MIMIC-IV-ED reader's (heart rate #4, SBP #7)."""
GENDERS = ("F", "M")
RACES = ("white", "black", "other")
RACE_PROBABILITIES = (0.6, 0.25, 0.15)


@dataclass(frozen=True)
class SyntheticStructure:
    """The generator's per-feature parameters (one entry per :data:`MEDICAL` feature, raw units)."""

    base: tuple[float, ...] = (37.0, 18.0, 97.0, 85.0, 3.0, 75.0, 125.0, 3.0)
    age: tuple[float, ...] = (-0.1, 1.0, -1.0, -6.0, 0.5, 4.0, 12.0, -0.5)
    gender: tuple[float, ...] = (0.1, 0.5, 0.0, -4.0, -0.5, 3.0, 6.0, 0.0)
    race: tuple[tuple[float, float, float], ...] = (
        (0.0, 0.1, 0.0),
        (0.0, 0.5, 1.0),
        (0.0, -0.5, 0.0),
        (0.0, 3.0, 1.5),
        (0.0, 0.5, 1.0),
        (0.0, 2.0, 1.0),
        (0.0, 5.0, 2.0),
        (0.0, -0.2, 0.2),
    )
    trend: tuple[float, ...] = (-0.2, -1.0, 0.5, -6.0, -1.5, -2.0, -5.0, -0.3)
    daily: tuple[float, ...] = (0.3, 1.0, 0.5, 6.0, 0.5, 3.0, 6.0, 0.0)
    yearly: tuple[float, ...] = (0.2, 0.5, 0.0, 2.0, 0.0, 1.0, 3.0, 0.1)
    noise: tuple[float, ...] = (0.3, 2.0, 1.0, 6.0, 1.5, 5.0, 8.0, 0.4)
    missing: tuple[float, ...] = (0.1, 0.15, 0.05, 0.05, 0.5, 0.1, 0.1, 0.7)
    mnar: tuple[float, ...] = (0.5, 0.5, -0.5, 0.0, 1.0, 0.3, 0.3, 0.0)


STRUCTURE = SyntheticStructure()
MAX_MEAN_GAP = 2.5
"""The largest mean gap between measurements (hours, age 18); see :func:`synthetic_record`."""
PRIVACY_UNIT = "per record (one synthetic patient, one record)"


def declared_ranges(
    structure: SyntheticStructure = STRUCTURE, horizon_hours: float = 48.0, spread: float = 3.0
) -> dict[str, tuple[float, float]]:
    """Public ``(low, high)`` of every scaled feature, from the generator's parameters alone (no record is drawn).

    ``start_time`` and ``age``: their exact supports. ``time_increment``: ``[0, 6 * MAX_MEAN_GAP]`` hours (a gap
    exceeds it with probability below 1e-3). Medical feature ``j``: ``base_j`` plus or minus the largest static,
    seasonal and daily effects, the trend over ``horizon_hours``, and ``spread`` standard deviations of the two noises
    (``sqrt(2) noise_j``). Values outside (later steps of long records, rare noise) are clipped by the scaler.
    """
    s = structure
    effects = (
        np.abs(s.age) + np.abs(s.gender) + np.abs(np.array(s.race)).max(axis=1) + np.abs(s.yearly) + np.abs(s.daily)
    )
    half = effects + np.abs(s.trend) * horizon_hours / 24.0 + spread * np.sqrt(2.0) * np.array(s.noise)
    medical = {name: (base - width, base + width) for name, base, width in zip(MEDICAL, s.base, half, strict=True)}
    static = {"start_time": (0.0, 365.0), "age": (18.0, 90.0), "time_increment": (0.0, 6 * MAX_MEAN_GAP)}
    return static | {name: (float(low), float(high)) for name, (low, high) in medical.items()}


def _sigmoid(value: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-value))


def _statics(rng: np.random.Generator) -> dict[str, float | str]:
    return {
        "start_time": float(rng.uniform(0.0, 365.0)),
        "age": float(rng.uniform(18.0, 90.0)),
        "gender": GENDERS[int(rng.integers(2))],
        "race": RACES[int(rng.choice(3, p=RACE_PROBABILITIES))],
    }


def mean_trajectory(static: dict[str, float | str], times: np.ndarray, structure: SyntheticStructure) -> np.ndarray:
    """The noise-free value of every feature at ``times`` for a record with ``static`` features: ``[T, 8]``."""
    s = structure
    day = times[:, None] / 24.0
    shift = (
        np.array(s.base)
        + np.array(s.age) * (float(static["age"]) - 54.0) / 36.0
        + np.array(s.gender) * (static["gender"] == "M")
        + np.array(s.race)[:, RACES.index(str(static["race"]))]
        + np.array(s.yearly) * np.cos(2 * np.pi * float(static["start_time"]) / 365.0)
    )
    phase = float(static["start_time"]) % 1.0
    return shift + np.array(s.trend) * day + np.array(s.daily) * np.sin(2 * np.pi * (day + phase))


def synthetic_record(
    index: int, rng: np.random.Generator, min_steps: int, max_steps: int, structure: SyntheticStructure
) -> RawRecord:
    """One record drawn from ``rng`` with the structure described in the module docstring."""
    static = _statics(rng)
    length = int(rng.integers(min_steps, max_steps + 1))
    mean_gap = 0.5 + (MAX_MEAN_GAP - 0.5) * (90.0 - float(static["age"])) / 72.0
    times = np.concatenate([[0.0], np.cumsum(rng.gamma(2.0, mean_gap / 2.0, size=length - 1))])
    noise = rng.standard_normal(len(MEDICAL)) + rng.standard_normal((length, len(MEDICAL)))
    values = mean_trajectory(static, times, structure) + np.array(structure.noise) * noise
    z = (values - values.mean(axis=0)) / (values.std(axis=0) + 1e-9)
    logit = np.log(np.array(structure.missing) / (1.0 - np.array(structure.missing)))
    missing = rng.random(values.shape) < _sigmoid(logit + np.array(structure.mnar) * z)
    return RawRecord(f"synthetic-{index}", times, np.where(missing, np.nan, values), static)


def synthetic_records(
    num_records: int = 2000,
    seed: int = 0,
    min_steps: int = 8,
    max_steps: int = 64,
    structure: SyntheticStructure = STRUCTURE,
) -> list[RawRecord]:
    """``num_records`` synthetic EHR records, a deterministic function of the arguments (each record its own patient).

    Raises:
        ValueError: unless ``num_records >= 1`` and ``2 <= min_steps <= max_steps``.
    """
    if num_records < 1 or not 2 <= min_steps <= max_steps:
        raise ValueError(
            f"num_records={num_records}, min_steps={min_steps}, max_steps={max_steps}: need num_records >= 1 and "
            "2 <= min_steps <= max_steps (e.g. --data.num_records 2000 --data.min_steps 8 --data.max_steps 64)"
        )
    rng = np.random.default_rng(seed)
    return [synthetic_record(i, rng, min_steps, max_steps, structure) for i in range(num_records)]
