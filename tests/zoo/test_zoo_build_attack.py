"""``dprobust zoo build`` of an entry of kind ``attack`` (an AIN generator): trained from its recipe on a tiny budget,
published with verified weights, and its recorded success rate reproduced by loading the published weights."""

from __future__ import annotations

import hashlib
import math
from pathlib import Path

import pytest
import yaml

from lightning_dprobust import zoo
from lightning_dprobust.cli import main
from lightning_dprobust.data import DigitsDataModule
from lightning_dprobust.robustness.ain_attack import AINAttack, success_rate
from lightning_dprobust.zoo import Zoo
from lightning_dprobust.zoo.build import build
from lightning_dprobust.zoo.build_attack import attack_bounds
from lightning_dprobust.zoo.catalog import ZooError

ROOT = Path(__file__).resolve().parents[2]
NAME = "ain_generator.ain_digits_target8"
TINY = {
    "model.init_args.initial_bound": 0.3,  # one epoch of exp decay -0.1: bound 0.3 e^-0.1 = 0.271, so success@0.3
    "model.init_args.ifgsm_steps": 3,
    "model.init_args.ifgsm_alpha": 0.07,
    "trainer.limit_train_batches": 3,
    "trainer.limit_val_batches": 1,
}


def _catalog(tmp_path: Path, overrides: dict) -> Zoo:
    """A catalog holding only the shipped targeted digits AIN entry, its recipe overrides extended."""
    data = yaml.safe_load((ROOT / "zoo" / "entries" / f"{NAME}.yaml").read_text())
    data["meta"]["recipe"]["overrides"] = {**data["meta"]["recipe"]["overrides"], **overrides}
    (tmp_path / "catalog" / "entries").mkdir(parents=True)
    (tmp_path / "catalog" / "entries" / f"{NAME}.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    return Zoo(tmp_path / "catalog")


def test_an_attack_entry_builds_from_its_recipe_and_its_success_rate_is_reproduced(tmp_path):
    shipped = {path: path.read_bytes() for path in (ROOT / "zoo").rglob("*") if path.is_file()}
    entry = build(NAME, epochs=1, out_dir=tmp_path / "out", zoo=_catalog(tmp_path, TINY))
    assert {path: path.read_bytes() for path in (ROOT / "zoo").rglob("*") if path.is_file()} == shipped
    weights = tmp_path / "out" / "weights" / entry.file
    assert entry.kind == "attack" and entry.status == "shipped" and entry.meta["privacy"] is None
    assert hashlib.sha256(weights.read_bytes()).hexdigest() == entry.sha256
    written = yaml.safe_load((tmp_path / "out" / "entries" / f"{NAME}.yaml").read_text())
    assert written == entry.to_dict() and written["meta"]["recipe"]["overrides"]["trainer.max_epochs"] == 1
    metrics = entry.meta["metrics"]
    assert metrics["bound"] == pytest.approx(0.3 * math.exp(-0.1), abs=1e-6)
    assert set(metrics) == {"bound", "success@0.3"}  # 0.1 and 0.2 lie below the bound the AIN reached
    assert entry.meta["robustness"] == {"attack": "AIN", "eps": metrics["bound"], "target_class": 8}
    local = Zoo(tmp_path / "out", base_url=(tmp_path / "out").as_uri(), cache_dir=tmp_path / "cache")
    generator = local.load(NAME)
    target = zoo.load("mlp_tanh.erm_digits")
    data = DigitsDataModule()
    data.setup("test")
    x, y = data.test_set.tensors
    measured = success_rate(target, AINAttack(target, generator, 0.3, seed=0)(x, y), y, 8)
    assert measured == pytest.approx(metrics["success@0.3"], abs=1e-6)


def test_attack_bounds_add_the_target_metrics_bounds_and_drop_those_below_the_trained_bound():
    entry = zoo.info("ain_generator.ain_mnist_target8")  # target_metrics: success@0.2, success@0.3
    assert attack_bounds(entry, 0.15) == [0.2, 0.3]
    tiny = zoo.info("ain_generator.ain_tiny_imagenet_target_espresso")
    named = {float(key.split("@")[1]) for key in tiny.meta["target_metrics"] if key.startswith("success@")}
    assert set(attack_bounds(tiny, 0.0)) == {0.1, 0.2, 0.3} | named


def test_the_cli_builds_an_attack_entry_into_out(tmp_path, monkeypatch, capsys):
    """``dprobust zoo build NAME --epochs 1 --out DIR`` (the catalog swapped for the tiny-budget one)."""
    catalog = _catalog(tmp_path, TINY)
    monkeypatch.setattr("lightning_dprobust.zoo.build.Zoo", lambda: catalog)
    assert main(["zoo", "build", NAME, "--epochs", "1", "--out", str(tmp_path / "out")]) == 0
    written = yaml.safe_load((tmp_path / "out" / "entries" / f"{NAME}.yaml").read_text())
    assert written["kind"] == "attack" and set(written["meta"]["metrics"]) == {"bound", "success@0.3"}
    printed = capsys.readouterr().out
    assert NAME in printed and f"weights: {tmp_path / 'out' / 'weights' / written['file']}" in printed


def test_a_recipe_that_trains_another_target_class_than_the_entry_is_refused(tmp_path):
    catalog = _catalog(tmp_path, {**TINY, "model.init_args.target_class": None})
    with pytest.raises(ZooError, match="target_class None, but the entry's meta.robustness.target_class is 8"):
        build(NAME, epochs=1, out_dir=tmp_path / "out", zoo=catalog)
    assert not (tmp_path / "out" / "entries").exists()
