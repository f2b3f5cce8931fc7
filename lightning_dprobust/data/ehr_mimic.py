"""PhysioNet MIMIC-IV-ED (Johnson et al. 2023, PhysioNet, doi:10.13026/5ntk-km72) as raw EHR records: one record per
emergency-department stay, as IGAMT uses it (Tang, PhD thesis, Emory University 2021, section 4.3.2).

Privacy unit: **per ED stay** (:data:`PRIVACY_UNIT`). DP-SGD samples and clips records, so a guarantee on these
records protects one stay; a patient (``subject_id``) with ``k`` stays is protected only at group size ``k`` (epsilon
roughly ``k`` times larger). The split keeps a patient's stays together, which keeps evaluation honest but does not
change that unit.

The data are credentialed and never shipped: put the module's ``ed/`` files in ``data_dir``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from lightning_dprobust.data.ehr_records import RawRecord
from lightning_dprobust.data.files import DatasetSource

FILES = ("edstays.csv", "triage.csv", "vitalsign.csv")
REQUIRED = {
    "edstays.csv": ("subject_id", "stay_id", "intime", "gender"),
    "triage.csv": (
        "subject_id",
        "stay_id",
        "temperature",
        "heartrate",
        "resprate",
        "o2sat",
        "sbp",
        "dbp",
        "pain",
        "acuity",
    ),
    "vitalsign.csv": (
        "subject_id",
        "stay_id",
        "charttime",
        "temperature",
        "heartrate",
        "resprate",
        "o2sat",
        "sbp",
        "dbp",
        "pain",
    ),
    "patients.csv": ("subject_id", "anchor_age", "anchor_year"),
}
VITALS = ("temperature", "resprate", "o2sat", "heartrate", "pain", "dbp", "sbp", "acuity")
"""The 8 temporal medical features (F = 9 with the time increment); heart rate is #4 and SBP #7 as in the thesis."""
UNKNOWN_RACE = ("UNKNOWN", "UNABLE", "DECLINED")
PRIVACY_UNIT = "per ED stay (stay_id): a patient (subject_id) with k stays is covered only at group size k"
DECLARED_RANGES = {
    "time_increment": (0.0, 24.0),
    "start_time": (0.0, 366.0),
    "age": (18.0, 100.0),
    "temperature": (90.0, 108.0),
    "resprate": (0.0, 60.0),
    "o2sat": (50.0, 100.0),
    "heartrate": (20.0, 220.0),
    "pain": (0.0, 10.0),
    "dbp": (20.0, 160.0),
    "sbp": (50.0, 250.0),
    "acuity": (1.0, 5.0),
}
"""Public ranges of the scaled features in MIMIC-IV-ED's units (hours, day of the year, years, degrees Fahrenheit,
breaths and beats per minute, %, the 0-10 pain scale, mmHg, the 1-5 ESI acuity): physiological and administrative
limits chosen without looking at the data. Values outside are clipped to the ends."""

SOURCE = DatasetSource(
    title="MIMIC-IV-ED",
    name="mimic_iv_ed",
    url="https://physionet.org/content/mimic-iv-ed/ (credentialed access: sign the data use agreement)",
    layout="{root}/edstays.csv, {root}/triage.csv and {root}/vitalsign.csv (the module's ed/ files, .csv or .csv.gz; "
    "optionally MIMIC-IV's hosp/patients.csv for the age)",
)


def _find(data_dir: Path, name: str) -> Path | None:
    """``name`` or ``name.gz`` under ``data_dir``, or ``None``."""
    for candidate in (data_dir / name, data_dir / f"{name}.gz"):
        if candidate.is_file():
            return candidate
    return None


def _load(data_dir: Path, name: str, path: Path) -> pd.DataFrame:
    frame = pd.read_csv(path, low_memory=False)
    absent = [column for column in REQUIRED[name] if column not in frame.columns]
    if absent:
        raise SOURCE.corrupt(data_dir, path, f"it lacks the column(s) {absent} of the official {name}")
    return frame


def race_group(race: object) -> str | None:
    """MIMIC-IV-ED's race (``ethnicity`` in v1.0) as ``white``, ``black`` or ``other``; unknown or declined -> None."""
    if not isinstance(race, str) or any(word in race.upper() for word in UNKNOWN_RACE):
        return None
    text = race.upper()
    return "white" if text.startswith("WHITE") else "black" if text.startswith("BLACK") else "other"


def _measurements(triage: pd.DataFrame, vitals: pd.DataFrame, stays: pd.DataFrame) -> pd.DataFrame:
    """Triage (at ``intime``) and vital-sign rows with ``hours`` since ``intime``, sorted by stay and time."""
    intime = stays.set_index("stay_id")["intime"]
    triage = triage.assign(hours=0.0)
    vitals = vitals.assign(
        hours=(pd.to_datetime(vitals["charttime"]) - vitals["stay_id"].map(intime)).dt.total_seconds() / 3600.0
    )
    rows = pd.concat([triage, vitals], ignore_index=True)
    rows = rows[rows["stay_id"].isin(intime.index) & rows["hours"].notna()]
    for name in VITALS:
        rows[name] = pd.to_numeric(rows.get(name), errors="coerce")
    rows.loc[(rows["pain"] < 0) | (rows["pain"] > 10), "pain"] = np.nan
    return rows.sort_values(["stay_id", "hours"], kind="stable")


def _statics(stays: pd.DataFrame, patients: pd.DataFrame | None) -> pd.DataFrame:
    """``start_time`` (day of the year of ``intime``), ``gender``, ``race`` and, with ``patients``, ``age``."""
    race = stays["race"] if "race" in stays.columns else stays.get("ethnicity", pd.Series(None, index=stays.index))
    intime = stays["intime"]
    table = pd.DataFrame(
        {
            "stay_id": stays["stay_id"],
            "subject_id": stays["subject_id"],
            "start_time": intime.dt.dayofyear - 1 + (intime - intime.dt.normalize()).dt.total_seconds() / 86400.0,
            "gender": stays["gender"].where(stays["gender"].isin(["F", "M"])),
            "race": race.map(race_group),
        }
    )
    if patients is not None:
        anchors = patients.drop_duplicates("subject_id").set_index("subject_id")
        table["age"] = (
            stays["subject_id"].map(anchors["anchor_age"])
            + intime.dt.year
            - stays["subject_id"].map(anchors["anchor_year"])
        )
    return table.set_index("stay_id")


def read_mimic_iv_ed(data_dir: str | Path) -> tuple[list[RawRecord], tuple[str, ...]]:
    """One :class:`RawRecord` per ED stay (grouped by ``subject_id``; the privacy unit is the stay, see the module
    docstring), and the continuous static features.

    Steps: the triage vitals at ``intime`` (time 0, the only step with ``acuity``), then every ``vitalsign.csv`` row at
    its ``charttime``; times are hours since ``intime``. Features (:data:`VITALS`): temperature, resprate, o2sat,
    heartrate, pain (non-numbers and values outside 0-10 are missing), dbp, sbp, acuity. Static: ``start_time`` (day of
    the year of ``intime``, with the fraction of the day), ``age`` (only with ``patients.csv``: ``anchor_age`` plus
    the years from ``anchor_year``), ``gender`` (F/M) and ``race`` grouped as white/black/other (unknown -> missing).
    Without ``patients.csv`` the records have no age: one continuous static feature, not two, so a model built for
    age (``configs/igamt/mimic_iv_ed.yaml``) needs ``static_continuous=1``; IGAMT and its baselines refuse a model
    whose static layout does not match the data at fit start.

    Raises:
        DatasetNotFoundError: naming the directory and the files to put there when one is missing, or a file lacks
            an official column.
    """
    data_dir = Path(data_dir).expanduser()
    paths = {name: _find(data_dir, name) for name in FILES}
    absent = [name for name, path in paths.items() if path is None]
    if absent:
        raise SOURCE.missing(data_dir, absent)
    stays, triage, vitals = (_load(data_dir, name, paths[name]) for name in FILES)
    stays["intime"] = pd.to_datetime(stays["intime"])
    patients_path = _find(data_dir, "patients.csv")
    patients = _load(data_dir, "patients.csv", patients_path) if patients_path else None
    statics = _statics(stays, patients)
    rows = _measurements(triage, vitals, stays)
    continuous = ("start_time", "age") if patients is not None else ("start_time",)
    statics = statics[~statics.index.duplicated()].loc[:, ["subject_id", *continuous, "gender", "race"]]
    return _records(rows, statics), continuous


def _records(rows: pd.DataFrame, statics: pd.DataFrame) -> list[RawRecord]:
    """One record per stay of ``rows`` (sorted by stay and time), its static features from ``statics``."""
    stays = rows["stay_id"].to_numpy()
    if not len(stays):
        return []
    starts = np.flatnonzero(np.r_[True, stays[1:] != stays[:-1]])
    hours = np.split(rows["hours"].to_numpy(np.float64), starts[1:])
    values = np.split(rows[list(VITALS)].to_numpy(np.float64), starts[1:])
    static = statics.loc[stays[starts]].astype(object)
    static = static.where(static.notna(), None)
    records = []
    for times, measured, row in zip(hours, values, static.to_dict("records"), strict=True):
        subject = row.pop("subject_id")
        records.append(RawRecord(str(subject), times, measured, row))
    return records
