"""The thesis's EHR preprocessing (section 4.3.2) on hand-made records: scaling, increments, masks, padding."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from fake_ehr import record

from lightning_dprobust.data.ehr_csv import read_long_csv, write_long_csv
from lightning_dprobust.data.ehr_records import decode, encode, encode_record, fit_schema
from lightning_dprobust.data.ehr_schema import EHRSchema

NAN = float("nan")
CATEGORICAL = {"gender": ("F", "M"), "race": ("white", "black", "other")}
MEDICAL = ("hr", "sbp", "e1", "e2", "e3", "e4")
"""Two medical features under test and four constant ones that widen a step to the 7 static slots."""


def rec(group, times, pairs, **static):
    """A record whose steps hold ``(hr, sbp)`` from ``pairs`` and the constants 1, 2, 3, 4."""
    return record(group, times, [[*pair, 1.0, 2.0, 3.0, 4.0] for pair in pairs], **static)


def thesis_records():
    """Three training records whose static ranges make the thesis's example come out (start time, age)."""
    return [
        rec(
            "a",
            [0.0, 1.0, 3.0],
            [[10.0, NAN], [NAN, 5.0], [30.0, 7.0]],
            start_time=0.0,
            age=18,
            gender="M",
            race="white",
        ),
        rec("b", [0.0, 2.0], [[20.0, 1.0], [25.0, NAN]], start_time=38.8, age=40, gender="F", race="black"),
        rec("c", [5.0], [[NAN, 9.0]], start_time=791.8, age=53, gender="F", race="other"),
    ]


def fit(records, num_steps=4, **kwargs):
    kwargs.setdefault("scaling", "train")
    return fit_schema(records, MEDICAL, ("start_time", "age"), CATEGORICAL, num_steps=num_steps, **kwargs)


def test_thesis_example_start_time_and_age_scaling():
    records = thesis_records()
    schema = fit_schema(records, MEDICAL, ("start_time", "age"), {}, num_steps=4, scaling="train")
    x, m = encode_record(records[1], schema)
    assert round(float(x[0, 0]), 3) == 0.049  # start time 38.8 -> 0.049
    assert round(float(x[0, 1]), 2) == 0.63  # age 40 -> 0.63
    assert m[0, :2].tolist() == [1.0, 1.0] and not m[0, 2:].any() and not x[0, 2:].any()  # zero padding


def test_layout_of_a_hand_made_record():
    records = thesis_records()
    schema = fit_schema(records, MEDICAL, ("start_time",), {"gender": ("F", "M")}, num_steps=4, scaling="train")
    x, m = encode_record(records[0], schema)
    assert x.shape == m.shape == (5, 7)
    # step 0: start_time 0 -> 0, gender M -> one-hot [0, 1], then 4 padding slots
    assert x[0].tolist() == [0.0, 0.0, 1.0, 0, 0, 0, 0] and m[0].tolist() == [1.0, 1.0, 1.0, 0, 0, 0, 0]
    # time increments 0, 1, 2 scaled by the training increments' range [0, 2]
    np.testing.assert_allclose(x[1:4, 0], [0.0, 0.5, 1.0])
    # hr 10, missing, 30 with training range [10, 30]; sbp missing, 5, 7 with range [1, 9]
    np.testing.assert_allclose(x[1:4, 1], [0.0, 0.0, 1.0])
    np.testing.assert_allclose(x[1:4, 2], [0.0, 0.5, 0.75])
    assert m[1:4, :3].tolist() == [[1, 1, 0], [1, 0, 1], [1, 1, 1]] and m[1:4, 3:].all()
    assert not x[4].any() and not m[4].any()  # zero padding after the record's 3 steps


def test_missing_values_are_zero_and_unobserved_and_scalers_skip_them():
    records = thesis_records()
    schema = fit(records)
    assert schema.temporal_low[1:3] == (10.0, 1.0) and schema.temporal_high[1:3] == (30.0, 9.0)
    x, m = encode(records, schema)
    assert torch.equal(x[m == 0], torch.zeros_like(x[m == 0]))
    raw = [r.values for r in records]
    for i, values in enumerate(raw):
        assert m[i, 1 : len(values) + 1, 1:].numpy().tolist() == (~np.isnan(values)).astype(float).tolist()


def test_truncation_to_num_steps_keeps_the_first_steps_and_fits_on_them():
    long = rec(
        "long",
        list(range(10)),
        [[float(v), float(v)] for v in range(10)],
        start_time=0.0,
        age=1,
        gender="F",
        race="white",
    )
    other = rec("other", [0.0], [[0.0, 0.0]], start_time=1.0, age=2, gender="M", race="black")
    schema = fit([long, other], num_steps=3)
    assert schema.temporal_high[1:3] == (2.0, 2.0)  # only the kept steps 0, 1, 2 count
    x, m = encode_record(long, schema)
    assert x.shape == (4, 7)
    np.testing.assert_allclose(x[1:, 1], [0.0, 0.5, 1.0])
    assert m[1:].all()


def test_unseen_category_and_missing_static_are_unobserved():
    records = thesis_records()
    schema = fit(records)
    odd = rec("d", [0.0], [[10.0, 1.0]], start_time=None, age=40, gender="X", race="black")
    x, m = encode_record(odd, schema)
    groups = schema.one_hot_groups
    assert not m[0, list(groups["gender"])].any() and not x[0, list(groups["gender"])].any()
    assert m[0, schema.continuous_static["start_time"]] == 0 and x[0, 0] == 0
    assert x[0, list(groups["race"])].tolist() == [0.0, 1.0, 0.0]


def test_values_beyond_the_training_range_are_clipped_into_unit_interval():
    schema = fit(thesis_records())
    far = rec(
        "far", [0.0, 100.0], [[1000.0, -50.0], [-1000.0, 50.0]], start_time=-5.0, age=99, gender="F", race="white"
    )
    x, _ = encode_record(far, schema)
    assert x.min() >= 0.0 and x.max() <= 1.0
    assert x[2, 0] == 1.0 and x[1, 1] == 1.0 and x[2, 1] == 0.0


def test_public_ranges_replace_the_training_min_max():
    schema = fit(thesis_records(), ranges={"hr": (0.0, 200.0), "age": (0.0, 100.0)})
    assert (schema.temporal_low[1], schema.temporal_high[1]) == (0.0, 200.0)
    assert (schema.static[1].low, schema.static[1].high) == (0.0, 100.0)
    with pytest.raises(ValueError, match="upper end"):
        fit(thesis_records(), ranges={"hr": (5.0, 5.0)})
    with pytest.raises(ValueError, match="not a feature"):
        fit(thesis_records(), ranges={"heart_rate": (0.0, 1.0)})


def test_inverse_transform_recovers_raw_units_and_marks_missing_nan():
    records = thesis_records()
    schema = fit(records)
    x, m = encode(records, schema)
    raw = schema.inverse_transform(x, m)
    np.testing.assert_allclose(raw[0, 1:4, 1:].numpy(), records[0].values, rtol=1e-6)
    np.testing.assert_allclose(raw[0, 1:4, 0].numpy(), [0.0, 1.0, 2.0], rtol=1e-6, atol=1e-6)
    assert math.isclose(float(raw[1, 0, 0]), 38.8, rel_tol=1e-6) and math.isclose(float(raw[1, 0, 1]), 40, rel_tol=1e-6)
    assert torch.isnan(raw[0, 4:]).all()  # padding steps
    assert raw[0, 0, list(schema.one_hot_groups["race"])].tolist() == [1.0, 0.0, 0.0]  # one-hot slots kept


def test_decode_inverts_encode():
    records = thesis_records()
    schema = fit(records)
    back = decode(*encode(records, schema), schema, groups=[r.group for r in records])
    for original, decoded in zip(records, back, strict=True):
        np.testing.assert_allclose(decoded.times, original.times - original.times[0], atol=1e-5)
        np.testing.assert_allclose(decoded.values, original.values, rtol=1e-5)
        assert (
            decoded.static["gender"] == original.static["gender"] and decoded.static["race"] == original.static["race"]
        )
        assert math.isclose(decoded.static["age"], original.static["age"], rel_tol=1e-6)


def test_too_many_static_slots_for_the_step_width_is_refused():
    narrow = [record(r.group, r.times, r.values[:, :2], **r.static) for r in thesis_records()]
    with pytest.raises(ValueError, match="need 7 slots of step 0 but a step has only 3 features"):
        fit_schema(narrow, ("hr", "sbp"), ("start_time", "age"), CATEGORICAL, scaling="train")


def test_sample_start_uses_the_layout_only():
    schema = fit(thesis_records())
    x0, m0 = schema.sample_start(64, torch.Generator().manual_seed(0))
    assert x0.shape == (64, 7) and m0[:, :7].all()
    for slots in schema.one_hot_groups.values():
        assert torch.equal(x0[:, list(slots)].sum(1), torch.ones(64))
    assert (x0[:, :2] >= 0).all() and (x0[:, :2] <= 1).all() and x0[:, :2].std() > 0.1


def test_schema_survives_a_weights_only_checkpoint(tmp_path):
    schema = fit(thesis_records())
    torch.save({"schema": schema.as_dict()}, tmp_path / "s.pt")
    loaded = torch.load(tmp_path / "s.pt", weights_only=True)["schema"]
    assert EHRSchema.from_dict(loaded) == schema


def test_tensors_survive_decode_and_the_long_csv(tmp_path):
    records = thesis_records()
    schema = fit(records)
    x, m = encode(records, schema)
    path = write_long_csv(decode(x, m, schema), schema.feature_names[1:], tmp_path / "out.csv")
    table = read_long_csv(path, features=schema.feature_names[1:])
    again = encode(sorted(table.records, key=lambda r: int(r.group)), schema)
    torch.testing.assert_close(again[1], m)
    torch.testing.assert_close(again[0], x, atol=1e-6, rtol=0)
