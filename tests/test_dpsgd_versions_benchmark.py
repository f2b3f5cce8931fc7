"""benchmarks/dpsgd_versions.py: the target epsilon and seed reach the DPCallback wherever a version's recipe holds
it, and the test accuracy is read from the table Lightning prints."""

from __future__ import annotations

import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
try:
    import dpsgd_versions
finally:
    sys.path.remove(str(ROOT / "benchmarks"))

OLD_STYLE = """
seed_everything: 0
trainer:
  max_epochs: 40
  callbacks:
    - class_path: lightning_dprobust.callbacks.DPCallback
      init_args: {max_grad_norm: 1.0, target_epsilon: 3.0}
    - class_path: lightning.pytorch.callbacks.ModelCheckpoint
      init_args: {save_last: true}
"""


def test_todays_recipe_gets_the_target_in_its_dp_group(tmp_path):
    config = yaml.safe_load(dpsgd_versions.recipe_at(ROOT, 8.0, 4, tmp_path).read_text())
    assert config["seed_everything"] == 4
    assert config["dp"]["target_epsilon"] == 8.0 and config["dp"]["noise_multiplier"] is None
    assert config["trainer"]["logger"] is False


def test_an_older_recipe_gets_the_target_in_its_trainer_callback(tmp_path):
    (tmp_path / "src" / "configs" / "dpsgd").mkdir(parents=True)
    (tmp_path / "src" / dpsgd_versions.RECIPE).write_text(OLD_STYLE)
    config = yaml.safe_load(dpsgd_versions.recipe_at(tmp_path / "src", 1.0, 2, tmp_path).read_text())
    assert config["seed_everything"] == 2
    assert config["trainer"]["callbacks"][0]["init_args"]["target_epsilon"] == 1.0
    assert config["trainer"]["callbacks"][1]["init_args"] == {"save_last": True}


def test_the_test_accuracy_is_read_from_lightnings_table():
    table = "┃   Test metric   ┃  DataLoader 0  ┃\n│    test/acc     │   0.9277777671813965   │\n│ test/loss │ 0.3 │"
    assert dpsgd_versions.TEST_ACCURACY.findall(table) == ["0.9277777671813965"]
