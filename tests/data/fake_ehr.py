"""Small fake MIMIC-IV-ED files in the official format (exact column names), and hand-made EHR records."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np

from lightning_dprobust.data.ehr_records import RawRecord

EDSTAYS = "subject_id,hadm_id,stay_id,intime,outtime,gender,race,arrival_transport,disposition"
TRIAGE = "subject_id,stay_id,temperature,heartrate,resprate,o2sat,sbp,dbp,pain,acuity,chiefcomplaint"
VITALSIGN = "subject_id,stay_id,charttime,temperature,heartrate,resprate,o2sat,sbp,dbp,rhythm,pain"
PATIENTS = "subject_id,gender,anchor_age,anchor_year,anchor_year_group,dod"

STAYS = [
    "10000032,22595853,33258284,2180-05-06 19:17:00,2180-05-06 23:30:00,F,WHITE,AMBULANCE,ADMITTED",
    "10000032,22841357,38112554,2180-06-26 15:54:00,2180-06-27 00:25:00,F,WHITE,AMBULANCE,ADMITTED",
    "10000084,23052089,35203156,2160-11-20 20:36:00,2160-11-21 03:20:00,M,BLACK/AFRICAN AMERICAN,WALK IN,HOME",
    "10000108,,32522732,2163-09-27 16:18:00,2163-09-28 09:04:00,M,UNKNOWN,WALK IN,HOME",
    "10000115,,35191393,2154-12-10 00:00:00,2154-12-10 04:00:00,F,ASIAN - CHINESE,WALK IN,HOME",
]
TRIAGES = [
    "10000032,33258284,98.4,70,16,97,106,63,0,3,Abd pain",
    "10000032,38112554,98.9,88,18,97,116,88,10,3,Abdominal distention",
    "10000084,35203156,,96,16,100,156,80,unable,2,Confusion",
    "10000108,32522732,97.7,80,16,100,124,84,4,3,Hematuria",
    "10000115,35191393,99.1,101,20,95,132,79,13,1,Fever",
]
VITALS = [
    "10000032,33258284,2180-05-06 20:20:00,98.4,70,16,97,106,63,,0",
    "10000032,33258284,2180-05-06 21:50:00,,72,,,110,65,Sinus Rhythm,",
    "10000032,38112554,2180-06-26 18:30:00,98.6,80,18,98,120,80,,5",
    "10000084,35203156,2160-11-20 22:06:00,98.1,94,17,99,150,78,,0",
    "10000108,32522732,2163-09-27 17:18:00,97.9,78,16,100,120,80,,3",
    "10000108,32522732,2163-09-27 19:48:00,,76,,,,,,",
    "10000115,35191393,2154-12-10 02:00:00,99.0,99,19,96,130,75,,2",
]
PATIENT_ROWS = [
    "10000032,F,52,2180,2014 - 2016,",
    "10000084,M,72,2160,2017 - 2019,",
    "10000108,M,25,2163,2014 - 2016,",
    "10000115,F,30,2154,2011 - 2013,",
]


def write_csv(path: Path, header: str, rows: list[str], gz: bool = False) -> Path:
    text = "\n".join([header, *rows]) + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    if gz:
        path = path.with_name(path.name + ".gz")
        with gzip.open(path, "wt") as stream:
            stream.write(text)
    else:
        path.write_text(text)
    return path


def write_mimic_iv_ed(root: Path, gz: bool = False, patients: bool = False) -> Path:
    """The three MIMIC-IV-ED files of :data:`STAYS` (+ MIMIC-IV's ``patients.csv`` if asked) under ``root``."""
    write_csv(root / "edstays.csv", EDSTAYS, STAYS, gz)
    write_csv(root / "triage.csv", TRIAGE, TRIAGES, gz)
    write_csv(root / "vitalsign.csv", VITALSIGN, VITALS, gz)
    if patients:
        write_csv(root / "patients.csv", PATIENTS, PATIENT_ROWS, gz)
    return root


def record(group: str, times: list[float], values: list[list[float]], **static) -> RawRecord:
    """A hand-made record (``float("nan")`` marks a missing value)."""
    return RawRecord(group, np.array(times, dtype=np.float64), np.array(values, dtype=np.float64), dict(static))
