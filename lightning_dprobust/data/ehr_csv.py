"""A generic long-format EHR CSV: one row per measurement, ``patient, time, feature, value`` plus optional static
columns; and its writer, so synthetic records can be saved in the same format and read back."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from lightning_dprobust.data.base import DatasetNotFoundError
from lightning_dprobust.data.ehr_records import RawRecord

COLUMNS = ("patient", "time", "feature", "value")
# Fields read as a missing value (besides an empty one): the markers of R, SQL and spreadsheets. NaN is not among
# them: a NaN or an infinity in a CSV is a computation gone wrong upstream, and is refused (see _check_finite).
MISSING_MARKERS = ("", "NA", "N/A", "n/a", "<NA>", "#N/A", "NULL", "null", "None")
PRIVACY_UNIT = "per patient (all rows of one 'patient' value form one record)"


@dataclass
class LongTable:
    """What :func:`read_long_csv` found: the records and the names of their features."""

    records: list[RawRecord]
    medical: tuple[str, ...]
    continuous: tuple[str, ...]
    categorical: tuple[str, ...]


def _hours(times: pd.Series, path: Path) -> pd.Series:
    """Numeric times as they are; date-times as hours since the patient's earliest measurement."""
    numeric = pd.to_numeric(times, errors="coerce")
    if numeric.notna().all():
        return numeric.astype(np.float64)
    stamps = pd.to_datetime(times, errors="coerce")
    if stamps.isna().any():
        bad = times[numeric.isna() & stamps.isna()].iloc[0]
        raise ValueError(f"{path}: time {bad!r} is neither a number nor a date-time; fix or drop that row")
    return (stamps - stamps.min()).dt.total_seconds() / 3600.0


def _check_finite(path: Path, frame: pd.DataFrame) -> None:
    """Raise ``ValueError`` naming the line of the first time, value or numeric static field that reads as NaN or
    infinity (``nan``, ``inf``, ``-Infinity``, ``1e400``, ...); the missing markers stay missing."""
    text = pd.read_csv(path, dtype=str, keep_default_na=False)
    static = [c for c in frame.columns if c not in COLUMNS and pd.api.types.is_numeric_dtype(frame[c])]
    for column in ("time", "value", *static):
        fields = text[column].str.strip()
        numbers = pd.to_numeric(fields.where(~fields.isin(MISSING_MARKERS)), errors="coerce")
        spelled = fields.str.lower().str.lstrip("+-").str.replace(r"^\d+\.#(ind|qnan|inf)$", "nan", regex=True)
        bad = ~fields.isin(MISSING_MARKERS) & (np.isinf(numbers) | (numbers.isna() & spelled.eq("nan")))
        if bad.any():
            row = int(np.flatnonzero(bad.to_numpy())[0])
            patient = text["patient"].iloc[row] if "patient" in text.columns else None
            raise ValueError(
                f"{path}, line {row + 2}: {column} {text[column].iloc[row]!r} (patient {patient!r}) is not a finite "
                "number: NaN and infinity are no measurement, and would be trained on as missing or clipped. Fix "
                "what computed it, or write a missing value as an empty field (or drop the row)"
            )


def read_long_csv(path: str | os.PathLike, features: Sequence[str] | None = None) -> LongTable:
    """Read ``patient, time, feature, value`` rows (extra columns are static features) into one record per patient.

    Times are numbers (any unit; hours by convention) or date-times (then hours since the file's first one). The
    measurements of one patient at one time form one step; a feature without a row (or with an empty value) there
    is missing. Several rows for the same patient, time and feature are averaged. Features are ordered as
    ``features`` lists them (default: by first appearance in the file). A static column is continuous when all its
    values are numbers, else categorical; a patient takes its first non-empty value.

    Raises:
        DatasetNotFoundError: if the file does not exist.
        ValueError: if a required column is missing, a time or value cannot be read, a time, value or static field
            is NaN or infinite (``nan``, ``inf``; the markers ``NA``, ``NULL``, ... and an empty field are missing
            values), or ``features`` misses one in the file.
    """
    path = Path(path).expanduser()
    if not path.is_file():
        raise DatasetNotFoundError(
            f"EHR CSV {path} not found: set --data.csv_path to a CSV with columns {', '.join(COLUMNS)} "
            "(one row per measurement; extra columns are static features)"
        )
    frame = pd.read_csv(path, dtype={"patient": str, "feature": str})
    absent = [column for column in COLUMNS if column not in frame.columns]
    if absent:
        raise ValueError(
            f"{path} lacks the column(s) {absent} (found {list(frame.columns)}): a long-format EHR CSV needs "
            f"{', '.join(COLUMNS)}, one row per measurement"
        )
    _check_finite(path, frame)
    frame["time"] = _hours(frame["time"], path)
    values = pd.to_numeric(frame["value"], errors="coerce")
    if (values.isna() & frame["value"].notna()).any():
        bad = frame["value"][values.isna() & frame["value"].notna()].iloc[0]
        raise ValueError(f"{path}: value {bad!r} is not a number; write missing values as an empty field")
    frame["value"] = values
    found = frame["feature"].dropna().unique().tolist()
    medical = tuple(found if features is None else features)
    unlisted = sorted(set(found) - set(medical))
    if unlisted:
        raise ValueError(f"{path} has the feature(s) {unlisted[:5]} that features={list(medical)} lacks: list them")
    static = [column for column in frame.columns if column not in COLUMNS]
    continuous = tuple(c for c in static if pd.api.types.is_numeric_dtype(frame[c]))
    categorical = tuple(c for c in static if c not in continuous)
    steps = frame.groupby(["patient", "time", "feature"])["value"].mean().unstack("feature")
    steps = steps.reindex(columns=list(medical))
    firsts = frame.groupby("patient")[static].first() if static else None
    records = []
    for patient, table in steps.groupby(level="patient", sort=True):
        row = {} if firsts is None else firsts.loc[patient].to_dict()
        statics = {name: (None if pd.isna(value) else value) for name, value in row.items()}
        for name in continuous:
            statics[name] = None if statics[name] is None else float(statics[name])
        times = table.index.get_level_values("time").to_numpy(np.float64)
        records.append(RawRecord(str(patient), times, table.to_numpy(np.float64), statics))
    return LongTable(records, medical, continuous, categorical)


def write_long_csv(records: Sequence[RawRecord], medical: Sequence[str], path: str | os.PathLike) -> Path:
    """Write ``records`` as a long-format CSV that :func:`read_long_csv` reads back (missing values get no row).

    A step whose medical features are all missing is written as one row with an empty value, so its time survives.
    """
    rows = []
    for record in records:
        for step, time in enumerate(record.times):
            observed = [(name, record.values[step, j]) for j, name in enumerate(medical)]
            observed = [(name, value) for name, value in observed if not np.isnan(value)] or [(medical[0], np.nan)]
            rows += [
                {"patient": record.group, "time": time, "feature": name, "value": value, **record.static}
                for name, value in observed
            ]
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_csv(path, index=False)
    return path
