"""The EHR readers on small fake files: the long-format CSV and PhysioNet MIMIC-IV-ED's official CSV format."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from fake_ehr import write_csv, write_mimic_iv_ed

from lightning_dprobust.data import DatasetNotFoundError
from lightning_dprobust.data.ehr import EHRDataModule
from lightning_dprobust.data.ehr_csv import read_long_csv, write_long_csv
from lightning_dprobust.data.ehr_mimic import DECLARED_RANGES, VITALS, read_mimic_iv_ed
from lightning_dprobust.data.ehr_records import encode, fit_schema
from lightning_dprobust.data.ehr_synthetic import MEDICAL, synthetic_records

LONG = [
    "p2,0.0,hr,80,70,F",
    "p2,0.0,sbp,120,70,F",
    "p2,1.5,hr,90,70,F",
    "p1,2.0,sbp,110,35,M",
    "p1,0.0,hr,60,35,M",
    "p1,0.0,hr,64,35,M",
    "p1,3.0,hr,,35,M",
]


def test_long_csv_groups_rows_into_steps(tmp_path):
    path = write_csv(tmp_path / "ehr.csv", "patient,time,feature,value,age,sex", LONG)
    table = read_long_csv(path)
    assert table.medical == ("hr", "sbp") and table.continuous == ("age",) and table.categorical == ("sex",)
    p1, p2 = table.records
    assert (p1.group, p2.group) == ("p1", "p2")
    np.testing.assert_array_equal(p1.times, [0.0, 2.0, 3.0])
    # two hr rows at time 0 are averaged; a step with only an empty value keeps its time, all missing
    np.testing.assert_array_equal(p1.values, [[62.0, np.nan], [np.nan, 110.0], [np.nan, np.nan]])
    np.testing.assert_array_equal(p2.values, [[80.0, 120.0], [90.0, np.nan]])
    assert p1.static == {"age": 35.0, "sex": "M"}


def test_long_csv_round_trip_of_synthetic_records(tmp_path):
    records = synthetic_records(30, seed=5)
    path = write_long_csv(records, MEDICAL, tmp_path / "synthetic.csv")
    assert set(read_long_csv(path).medical) == set(MEDICAL)
    table = read_long_csv(path, features=MEDICAL)
    assert table.medical == MEDICAL
    categorical = {name: None for name in table.categorical}
    by_group = {r.group: r for r in table.records}
    read = [by_group[r.group] for r in records]
    direct = fit_schema(records, MEDICAL, table.continuous, categorical, scaling="train")
    assert fit_schema(read, MEDICAL, table.continuous, categorical, scaling="train") == direct
    for a, b in zip(encode(records, direct), encode(read, direct), strict=True):
        torch.testing.assert_close(a, b)


def test_long_csv_datetimes_become_hours(tmp_path):
    rows = ["a,2180-05-06 19:00:00,hr,1", "a,2180-05-06 20:30:00,hr,2", "b,2180-05-07 19:00:00,hr,3"]
    table = read_long_csv(write_csv(tmp_path / "t.csv", "patient,time,feature,value", rows))
    np.testing.assert_allclose(table.records[0].times, [0.0, 1.5])
    np.testing.assert_allclose(table.records[1].times, [24.0])


def test_long_csv_bad_files_are_refused_with_one_line(tmp_path):
    with pytest.raises(DatasetNotFoundError, match="set --data.csv_path") as error:
        read_long_csv(tmp_path / "absent.csv")
    assert "\n" not in str(error.value)
    with pytest.raises(ValueError, match=r"lacks the column\(s\) \['feature'\]"):
        read_long_csv(write_csv(tmp_path / "a.csv", "patient,time,value", ["a,0,1"]))
    with pytest.raises(ValueError, match=r"the feature\(s\) \['sbp'\] that features=\['hr'\] lacks"):
        read_long_csv(write_csv(tmp_path / "c.csv", "patient,time,feature,value", ["a,0,sbp,1"]), features=["hr"])
    with pytest.raises(ValueError, match="value 'high' is not a number"):
        read_long_csv(write_csv(tmp_path / "b.csv", "patient,time,feature,value", ["a,0,hr,high"]))


@pytest.mark.parametrize(
    ("header", "row", "phrase"),
    [
        ("patient,time,feature,value", "a,1,hr,inf", "line 3: value 'inf' (patient 'a')"),
        ("patient,time,feature,value", "a,1,hr,-Infinity", "line 3: value '-Infinity' (patient 'a')"),
        ("patient,time,feature,value", "a,1,hr,NaN", "line 3: value 'NaN' (patient 'a')"),
        ("patient,time,feature,value", "a,1,hr,1e400", "line 3: value '1e400' (patient 'a')"),
        ("patient,time,feature,value", "a,inf,hr,1", "line 3: time 'inf' (patient 'a')"),
        ("patient,time,feature,value,age", "a,1,hr,1,inf", "line 3: age 'inf' (patient 'a')"),
    ],
)
def test_long_csv_refuses_nan_and_infinite_numbers_naming_the_line(tmp_path, header, row, phrase):
    """NaN or infinity in a CSV is a computation gone wrong upstream, not a measurement: read as missing or clipped
    to a declared range, it would be trained on silently."""
    extra = ",40" if header.endswith("age") else ""
    path = write_csv(tmp_path / "ehr.csv", header, [f"a,0,hr,80{extra}", row])
    with pytest.raises(ValueError, match="is not a finite number") as error:
        read_long_csv(path)
    assert phrase in str(error.value) and "empty field" in str(error.value) and "\n" not in str(error.value)


def test_long_csv_missing_markers_stay_missing(tmp_path):
    rows = ["a,0,hr,80,40", "a,1,hr,,40", "a,2,hr,NA,", "a,3,hr,NULL,N/A"]
    table = read_long_csv(write_csv(tmp_path / "ehr.csv", "patient,time,feature,value,age", rows))
    np.testing.assert_array_equal(table.records[0].values.ravel(), [80.0, np.nan, np.nan, np.nan])
    assert table.records[0].static == {"age": 40.0}


def test_with_training_scaling_the_test_split_does_not_change_the_scalers_or_the_training_tensors(tmp_path):
    records = synthetic_records(60, seed=6)
    base = EHRDataModule(
        source="csv",
        csv_path=str(write_long_csv(records, MEDICAL, tmp_path / "a.csv")),
        features=MEDICAL,
        scaling="train",
    )
    base.setup()
    test_groups = {r.group for r in base.records["test"]}
    for r in records:
        if r.group in test_groups:
            r.values = r.values * 100.0 - 50.0
            r.static["age"] = 500.0
    changed = EHRDataModule(
        source="csv",
        csv_path=str(write_long_csv(records, MEDICAL, tmp_path / "b.csv")),
        features=MEDICAL,
        scaling="train",
    )
    changed.setup()
    assert {r.group for r in changed.records["test"]} == test_groups
    assert changed.schema == base.schema
    for a, b in zip(base.train_set.tensors, changed.train_set.tensors, strict=True):
        assert torch.equal(a, b)
    assert not torch.equal(base.test_set.tensors[0], changed.test_set.tensors[0])


def test_mimic_iv_ed_records_follow_the_official_files(tmp_path):
    records, continuous = read_mimic_iv_ed(write_mimic_iv_ed(tmp_path))
    assert continuous == ("start_time",) and len(records) == 5
    first = records[0]  # stay 32522732 of subject 10000108 (sorted by stay_id)
    assert first.group == "10000108" and first.static["race"] is None and first.static["gender"] == "M"
    np.testing.assert_allclose(first.times, [0.0, 1.0, 3.5])
    heart, pain, acuity = VITALS.index("heartrate"), VITALS.index("pain"), VITALS.index("acuity")
    assert first.values[:, heart].tolist() == [80.0, 78.0, 76.0]
    assert first.values[0, acuity] == 3.0 and np.isnan(first.values[1:, acuity]).all()
    assert np.isnan(first.values[2, VITALS.index("sbp")])
    by_stay = {(r.group, round(float(r.static["start_time"]), 4)): r for r in records}
    black = next(r for r in records if r.group == "10000084")
    assert black.static["race"] == "black" and np.isnan(black.values[0, pain])  # "unable" -> missing
    asian = next(r for r in records if r.group == "10000115")
    assert asian.static["race"] == "other" and np.isnan(asian.values[0, pain])  # 13 is outside 0-10
    assert math.isclose(asian.static["start_time"], 343.0)  # 2154-12-10 00:00 is day 344 of a leap year
    assert len(by_stay) == 5


def test_mimic_iv_ed_gzipped_with_patients_gives_age(tmp_path):
    records, continuous = read_mimic_iv_ed(write_mimic_iv_ed(tmp_path, gz=True, patients=True))
    assert continuous == ("start_time", "age")
    ages = {r.group: r.static["age"] for r in records}
    assert ages["10000032"] == 52 and ages["10000084"] == 72


def test_mimic_iv_ed_data_module_splits_by_subject(tmp_path):
    datamodule = EHRDataModule(
        source="mimic_iv_ed", data_dir=str(write_mimic_iv_ed(tmp_path)), val_fraction=0.2, test_fraction=0.2
    )
    x, m = next(iter(datamodule.train_dataloader()))
    assert tuple(x.shape[1:]) == (51, 9) and datamodule.schema.feature_names[4] == "heartrate"
    assert datamodule.schema.feature_names[7] == "sbp"
    subjects = [{r.group for r in records} for records in datamodule.records.values()]
    assert sum(map(len, subjects)) == len(set().union(*subjects)) == 4  # subject 10000032's two stays stay together


def test_missing_mimic_files_give_one_line_naming_folder_and_files(tmp_path):
    write_csv(tmp_path / "edstays.csv", "subject_id,stay_id,intime,gender", [])
    with pytest.raises(DatasetNotFoundError) as error:
        read_mimic_iv_ed(tmp_path)
    message = str(error.value)
    assert "\n" not in message and str(tmp_path) in message
    assert "triage.csv" in message and "vitalsign.csv" in message and "physionet" in message.lower()


def test_mimic_file_without_an_official_column_is_refused(tmp_path):
    write_mimic_iv_ed(tmp_path)
    write_csv(tmp_path / "triage.csv", "subject_id,stay_id,temperature", ["1,2,98"])
    with pytest.raises(DatasetNotFoundError, match="lacks the column"):
        read_mimic_iv_ed(tmp_path)


def test_with_public_ranges_and_categories_the_schema_does_not_depend_on_the_data(tmp_path):
    public = {"time_increment": (0.0, 24.0), "start_time": (0.0, 366.0), "age": (0.0, 120.0)}
    public |= {name: (0.0, 300.0) for name in MEDICAL}
    categories = {"gender": ["F", "M"], "race": ["white", "black", "other"]}
    schemas = []
    for seed in (7, 8):
        path = write_long_csv(synthetic_records(40, seed=seed), MEDICAL, tmp_path / f"{seed}.csv")
        datamodule = EHRDataModule(
            source="csv", csv_path=str(path), features=MEDICAL, ranges=public, categories=categories
        )
        schemas.append(datamodule.schema)
    assert schemas[0] == schemas[1]
    learned = [
        EHRDataModule(source="csv", csv_path=str(tmp_path / f"{seed}.csv"), features=MEDICAL, scaling="train").schema
        for seed in (7, 8)
    ]
    assert learned[0] != learned[1]  # without them, the schema reveals the training data's extremes
    with pytest.raises(ValueError, match="not a discrete static column"):
        EHRDataModule(source="csv", csv_path=str(tmp_path / "7.csv"), categories={"sex": ["F"]}).setup()


def test_a_csv_without_declared_ranges_is_refused_under_public_scaling(tmp_path):
    path = write_long_csv(synthetic_records(20, seed=3), MEDICAL, tmp_path / "a.csv")
    with pytest.raises(ValueError, match=r"no declared range.*pass ranges=\{'time_increment'") as error:
        EHRDataModule(source="csv", csv_path=str(path), features=MEDICAL).setup()
    assert "\n" not in str(error.value)
    public = {"time_increment": (0.0, 24.0), "start_time": (0.0, 366.0), "age": (0.0, 120.0)}
    public |= {name: (0.0, 300.0) for name in MEDICAL}
    with pytest.raises(ValueError, match=r"no declared categories.*pass categories=\{'gender'"):
        EHRDataModule(source="csv", csv_path=str(path), features=MEDICAL, ranges=public).setup()


def test_mimic_iv_ed_uses_declared_ranges_and_states_its_unit_per_stay(tmp_path):
    datamodule = EHRDataModule(source="mimic_iv_ed", data_dir=str(write_mimic_iv_ed(tmp_path)), val_fraction=0.2)
    schema = datamodule.schema
    assert schema.data_derived == () and schema.privacy_unit.startswith("per ED stay")
    heart = schema.feature_names.index("heartrate")
    assert (schema.temporal_low[heart], schema.temporal_high[heart]) == DECLARED_RANGES["heartrate"]
