"""The EHR data module on the embedded synthetic generator: the (x, m) contract, splits, and the generator's known
structure."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lightning_dprobust.data.ehr import EHRDataModule, check_ehr_batch
from lightning_dprobust.data.ehr_synthetic import MEDICAL, STRUCTURE, synthetic_records


@pytest.fixture(scope="module")
def datamodule() -> EHRDataModule:
    return EHRDataModule(num_records=300, batch_size=32)


def test_loaders_yield_the_contract(datamodule):
    schema = datamodule.schema
    assert schema.shape == (51, 9) and schema.time_feature == 0 and schema.num_steps == 50
    for loader in (datamodule.train_dataloader(), datamodule.val_dataloader(), datamodule.test_dataloader()):
        x, m = next(iter(loader))
        assert x.dtype == m.dtype == torch.float32
        check_ehr_batch(x, m, schema)
        # step 0: 7 static slots observed, 2 padding slots zero and unobserved
        assert m[:, 0, :7].all() and not m[:, 0, 7:].any() and not x[:, 0, 7:].any()
        # the time increment is observed exactly on the record's steps; the first increment is 0
        steps = m[:, 1:, 0]
        assert torch.all(steps[:, :-1] >= steps[:, 1:])  # observed steps first, then padding
        assert torch.all(x[:, 1, 0] == 0)
        padding = steps == 0
        assert not m[:, 1:][padding].any() and not x[:, 1:][padding].any()


def test_records_are_padded_and_truncated_to_fifty_steps(datamodule):
    x, m = datamodule.train_set.tensors
    lengths = m[:, 1:, 0].sum(1)
    records = datamodule.records["train"]
    assert lengths.tolist() == [min(len(r.times), 50) for r in records]
    assert lengths.max() == 50 and lengths.min() < 50  # the generator makes both kinds


def test_increments_and_values_match_the_raw_records(datamodule):
    x, m = datamodule.train_set.tensors
    raw = datamodule.schema.inverse_transform(x, m)
    for i in (0, 7):
        record = datamodule.records["train"][i]
        steps = min(len(record.times), 50)
        np.testing.assert_allclose(
            raw[i, 1 : steps + 1, 0].numpy(), np.diff(record.times[:steps], prepend=0.0), rtol=1e-5, atol=1e-5
        )
        np.testing.assert_allclose(raw[i, 1 : steps + 1, 1:].numpy(), record.values[:steps], rtol=1e-5, atol=1e-4)


def test_split_keeps_patients_apart_and_depends_on_seed_only():
    first, again, other = (EHRDataModule(num_records=200, seed=seed) for seed in (0, 0, 1))
    for datamodule in (first, again, other):
        datamodule.setup()
    groups = {name: {r.group for r in records} for name, records in first.records.items()}
    assert not (groups["train"] & groups["val"]) and not (groups["train"] & groups["test"])
    assert not (groups["val"] & groups["test"]) and sum(map(len, groups.values())) == 200
    assert len(groups["test"]) == len(groups["val"]) == 20
    assert torch.equal(first.train_set.tensors[0], again.train_set.tensors[0])
    assert {r.group for r in other.records["test"]} != groups["test"]


def test_with_training_scaling_the_scalers_come_from_the_training_split_only():
    datamodule = EHRDataModule(num_records=200, scaling="train")
    datamodule.setup()
    train = datamodule.records["train"]
    values = np.concatenate([r.values[:50] for r in train])
    assert datamodule.schema.temporal_low[1:] == tuple(np.nanmin(values, axis=0).tolist())
    assert datamodule.schema.temporal_high[1:] == tuple(np.nanmax(values, axis=0).tolist())
    everything = np.concatenate([r.values[:50] for records in datamodule.records.values() for r in records])
    assert tuple(np.nanmax(everything, axis=0).tolist()) != datamodule.schema.temporal_high[1:]


def test_static_features_shift_the_trajectories():
    records = [r for r in synthetic_records(2000, seed=3) if not np.isnan(r.values[0, MEDICAL.index("heartrate")])]
    heart = MEDICAL.index("heartrate")  # at time 0, where the trend has not started yet

    def mean_gap(first, second):
        return np.mean([r.values[0, heart] for r in second]) - np.mean([r.values[0, heart] for r in first])

    women, men = ([r for r in records if r.static["gender"] == g] for g in ("F", "M"))
    assert abs(mean_gap(women, men) - STRUCTURE.gender[heart]) < 1.5
    young, old = [r for r in records if r.static["age"] < 40], [r for r in records if r.static["age"] > 70]
    years = np.mean([r.static["age"] for r in old]) - np.mean([r.static["age"] for r in young])
    assert abs(mean_gap(young, old) - STRUCTURE.age[heart] * years / 36.0) < 2.0


def test_missingness_depends_on_the_feature_and_sampling_is_irregular():
    records = synthetic_records(500, seed=4)
    values = np.concatenate([r.values for r in records])
    rates = np.isnan(values).mean(axis=0)
    assert rates.argmax() == MEDICAL.index("acuity") and rates.argmin() in (
        MEDICAL.index(n) for n in ("o2sat", "heartrate")
    )
    gaps = np.concatenate([np.diff(r.times) for r in records])
    assert gaps.min() > 0 and gaps.std() / gaps.mean() > 0.5
    old = np.concatenate([np.diff(r.times) for r in records if r.static["age"] > 70]).mean()
    young = np.concatenate([np.diff(r.times) for r in records if r.static["age"] < 40]).mean()
    assert old < young  # older patients are measured more often


def test_generator_is_seeded():
    a, b, c = synthetic_records(5, seed=1), synthetic_records(5, seed=1), synthetic_records(5, seed=2)
    assert all(np.array_equal(x.values, y.values, equal_nan=True) for x, y in zip(a, b, strict=True))
    assert not np.array_equal(a[0].times, c[0].times)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"source": "fhir"}, "source='fhir' is not one of"),
        ({"source": "csv"}, "set --data.csv_path"),
        ({"features": ["hr"]}, "has fixed ones"),
        ({"categories": {"race": ["a"]}}, "has fixed ones"),
        ({"num_steps": 0}, "num_steps=0"),
        ({"val_fraction": 1.5}, "val_fraction must lie in"),
    ],
)
def test_bad_arguments_are_refused_with_one_line(kwargs, match):
    with pytest.raises(ValueError, match=match) as error:
        EHRDataModule(**kwargs)
    assert "\n" not in str(error.value)


def test_check_ehr_batch_refuses_broken_batches(datamodule):
    schema = datamodule.schema
    x, m = datamodule.train_set.tensors[0][:4].clone(), datamodule.train_set.tensors[1][:4].clone()
    with pytest.raises(ValueError, match=r"must be \[B, 51, 9\]"):
        check_ehr_batch(x[:, :50], m[:, :50], schema)
    bad = x.clone()
    bad[m == 0] = 0.5
    with pytest.raises(ValueError, match="0 where the mask is 0"):
        check_ehr_batch(bad, m, schema)
    with pytest.raises(ValueError, match=r"in \[0, 1\]"):
        check_ehr_batch(x * 2 + 0.1, m, schema)


def test_the_train_loader_can_be_poisson_sampled_for_dp(datamodule):
    from lightning_dprobust.callbacks.dp_loader import PoissonLoaderFactory

    factory = PoissonLoaderFactory(sample_rate=None, mask_seed=lambda: 0, poisson=True)
    loader = factory._build(datamodule.train_dataloader(), rank=0, world_size=1)
    assert factory.sample_rate == pytest.approx(32 / len(datamodule.train_set))
    sizes = []
    for x, m in loader:
        assert tuple(x.shape[1:]) == tuple(m.shape[1:]) == (51, 9)
        sizes.append(len(x))
    assert len(set(sizes)) > 1 and sum(sizes) == pytest.approx(len(datamodule.train_set), rel=0.3)


def _train_tensors_by_group(datamodule: EHRDataModule) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    x, m = datamodule.train_set.tensors
    return {record.group: (x[i], m[i]) for i, record in enumerate(datamodule.records["train"])}


def test_adding_one_record_changes_no_other_training_tensor(monkeypatch):
    """The default (public, declared) scaling: a training tensor is a function of its own record alone, so a neighbour
    dataset with one extreme record added leaves every other record's training tensor as it was (the strict_dp
    requirement; with the training split's min/max the extreme record would rescale all of them)."""
    base = synthetic_records(120, seed=0)
    extreme = synthetic_records(1, seed=99)[0]
    extreme.group, extreme.values, extreme.static["age"] = "added", extreme.values * 10.0, 89.9
    extreme.times = extreme.times * 5.0
    tensors = []
    for records in (base, [*base, extreme]):
        monkeypatch.setattr("lightning_dprobust.data.ehr.synthetic_records", lambda n, seed, r=records: list(r))
        datamodule = EHRDataModule(num_records=len(records), num_steps=12)
        assert datamodule.schema.public_scaling
        tensors.append(_train_tensors_by_group(datamodule))
    assert "added" in tensors[1]
    shared = set(tensors[0]) & set(tensors[1])
    assert len(shared) >= 60
    for group in shared:
        assert torch.equal(tensors[0][group][0], tensors[1][group][0]) and torch.equal(
            tensors[0][group][1], tensors[1][group][1]
        )


def test_training_scaling_is_recorded_as_data_derived():
    public, private = (EHRDataModule(num_records=60, scaling=scaling).schema for scaling in ("public", "train"))
    assert public.data_derived == () and public.privacy_unit.startswith("per record")
    assert set(private.data_derived) == {"time_increment", *MEDICAL, "start_time", "age"}
    with pytest.raises(ValueError, match="scaling='public'"):
        EHRDataModule(scaling="min_max")
