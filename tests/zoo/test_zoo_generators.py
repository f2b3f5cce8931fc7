"""Generator entries of the zoo: released EHR synthesizers, loaded alone and scored as their build recorded."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from lightning_dprobust import zoo
from lightning_dprobust.data.ehr import EHRDataModule
from lightning_dprobust.metrics.synthetic_eval import evaluate_generator
from lightning_dprobust.models.ehr_release import ReleasedSynthesizer
from lightning_dprobust.zoo import CatalogError
from lightning_dprobust.zoo.build import recipe_config

ROOT = Path(__file__).resolve().parents[2]
GENERATORS = [entry for entry in zoo.list_entries() if entry.kind == "generator"]
SHIPPED = [entry for entry in GENERATORS if entry.shipped]


def test_generator_entries_build_released_synthesizers_and_name_their_privacy():
    assert {entry.name for entry in GENERATORS} >= {
        "igamt.dp_synthetic_ehr_s10",
        "ehr_vae.dp_synthetic_ehr_s10",
        "igamt.dp_mimic_iv_ed_s10",
    }
    for entry in GENERATORS:
        model = entry.build_model()
        assert isinstance(model, ReleasedSynthesizer) and model.config == entry.model["kwargs"]
        assert {key.split(".")[0] for key in model.state_dict()} == {"generator", "body", "last"}
    mimic = zoo.info("igamt.dp_mimic_iv_ed_s10")
    assert not mimic.shipped and mimic.meta["target_metrics"]["minkowski"] == pytest.approx(3.974107)


def test_an_unknown_kind_is_refused(tmp_path):
    text = (ROOT / "zoo" / "entries" / "igamt.dp_mimic_iv_ed_s10.yaml").read_text()
    (tmp_path / "entries").mkdir()
    (tmp_path / "entries" / "igamt.dp_mimic_iv_ed_s10.yaml").write_text(text.replace("kind: generator", "kind: gan"))
    with pytest.raises(CatalogError, match="kind 'gan' must be one of"):
        zoo.Zoo(catalog_dir=tmp_path).list_entries()


@pytest.mark.parametrize("entry", SHIPPED, ids=lambda entry: entry.name)
def test_shipped_generators_reproduce_their_recorded_similarity_and_privacy(entry, monkeypatch, tmp_path):
    monkeypatch.setenv("DPROBUST_HOME", str(tmp_path))
    release = zoo.load(entry.name)
    config, _ = recipe_config(entry)
    data = EHRDataModule(**config["data"]["init_args"])
    data.setup("test")
    report, (x, m) = evaluate_generator(release, data.test_set.tensors)
    assert x.shape == data.test_set.tensors[0].shape and torch.equal(x * (1 - m), torch.zeros_like(x))
    recorded = entry.meta["metrics"]
    for key, value in report.items():
        assert recorded[key.removeprefix("synthetic/").replace("/", "_")] == pytest.approx(value, abs=1e-5)
    privacy = entry.meta["privacy"]
    assert privacy["noise_multiplier"] == 1.0 and 0 < privacy["epsilon"] < float("inf") and privacy["delta"] == 1e-5


def test_generator_records_state_their_privacy_unit_and_public_scaling():
    for entry in GENERATORS:
        notes, transform = entry.meta["notes"], entry.preprocessing["transform"]
        unit = "per ED stay" if entry.meta["dataset"] == "mimic_iv_ed" else "per record (one synthetic patient"
        assert f"privacy unit: {unit}" in notes.replace("Privacy unit", "privacy unit"), entry.name
        assert "scaling=public" in transform and "train-split scalers" not in transform, entry.name
    mimic = zoo.info("igamt.dp_mimic_iv_ed_s10").meta["notes"]
    assert "group size k" in mimic and "excludes the scaling's cost" in mimic
