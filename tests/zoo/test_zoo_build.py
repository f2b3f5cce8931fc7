"""``zoo_build``: recipe overrides, the git commit, and real builds of the shipped digits entries."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import torch
import yaml

from lightning_dprobust import zoo
from lightning_dprobust.data import DigitsDataModule
from lightning_dprobust.zoo import Zoo
from lightning_dprobust.zoo.build import apply_override, build, config_sha256, git_commit, recipe_config
from lightning_dprobust.zoo.catalog import ZooError

ROOT = Path(__file__).resolve().parents[2]
DIGITS_DP = "*.dpsgd_digits_eps3"


def sample_config() -> dict:
    return {
        "trainer": {
            "callbacks": [
                {"class_path": "a.DPCallback", "init_args": {"target_epsilon": 3.0}},
                {"class_path": "b.ModelCheckpoint", "init_args": {}},
            ]
        },
        "model": {"init_args": {"lr": 0.1}},
    }


def test_overrides_select_list_elements_by_index_or_class_name():
    config = sample_config()
    apply_override(config, "trainer.callbacks.DPCallback.init_args.target_epsilon", 1.0)
    apply_override(config, "trainer.callbacks.1.init_args.save_last", True)
    apply_override(config, "trainer.max_epochs", 2)
    apply_override(config, "model.init_args.model_kwargs.hidden", 8)
    expected = sample_config()
    expected["trainer"]["callbacks"][0]["init_args"]["target_epsilon"] = 1.0
    expected["trainer"]["callbacks"][1]["init_args"]["save_last"] = True
    expected["trainer"]["max_epochs"] = 2
    expected["model"]["init_args"]["model_kwargs"] = {"hidden": 8}
    assert config == expected


@pytest.mark.parametrize("path", ["trainer.callbacks.EarlyStopping.init_args.patience", "trainer.callbacks.2.x"])
def test_an_override_of_a_missing_list_element_names_the_choices(path):
    with pytest.raises(ZooError, match="a.DPCallback"):
        apply_override(sample_config(), path, 1)


def test_recipe_config_applies_the_entry_overrides_and_epochs():
    entry = zoo.list_entries(DIGITS_DP)[0]
    config, overrides = recipe_config(entry, epochs=2)
    assert config["dp"]["target_epsilon"] == 3.0 and overrides["dp.target_epsilon"] == 3.0
    assert config["trainer"]["max_epochs"] == 2 and overrides["trainer.max_epochs"] == 2
    with pytest.raises(ZooError, match="epochs must be >= 1"):
        recipe_config(entry, epochs=0)


def test_git_commit_reads_refs_packed_refs_and_detached_heads(tmp_path):
    sha_a, sha_b = "a" * 40, "b" * 40
    git = tmp_path / ".git"
    (git / "refs" / "heads").mkdir(parents=True)
    (git / "HEAD").write_text("ref: refs/heads/main\n")
    (git / "refs" / "heads" / "main").write_text(sha_a + "\n")
    assert git_commit(tmp_path) == sha_a
    (git / "refs" / "heads" / "main").unlink()
    (git / "packed-refs").write_text(f"# pack-refs with: peeled\n{sha_b} refs/heads/main\n")
    assert git_commit(tmp_path) == sha_b
    (git / "HEAD").write_text(sha_a + "\n")
    assert git_commit(tmp_path) == sha_a
    assert git_commit(tmp_path / "not-a-repo") is None


def test_git_commit_follows_a_worktree_link(tmp_path):
    common = tmp_path / "main" / ".git"
    linked = common / "worktrees" / "wt"
    (common / "refs" / "heads").mkdir(parents=True)
    linked.mkdir(parents=True)
    (common / "refs" / "heads" / "feature").write_text("c" * 40)
    (linked / "HEAD").write_text("ref: refs/heads/feature\n")
    (linked / "commondir").write_text("../..\n")
    (tmp_path / "wt").mkdir()
    (tmp_path / "wt" / ".git").write_text(f"gitdir: {linked}\n")
    assert git_commit(tmp_path / "wt") == "c" * 40


def test_git_commit_of_this_checkout_is_a_sha():
    commit = git_commit(ROOT)
    assert commit is None or len(commit) == 40 and int(commit, 16) >= 0


def accuracy_of(model: torch.nn.Module) -> float:
    data = DigitsDataModule()
    data.setup("test")
    images, labels = data.test_set.tensors
    with torch.no_grad():
        return (model(images).argmax(dim=1) == labels).float().mean().item()


def test_a_one_epoch_build_publishes_verified_weights_into_out_dir(tmp_path):
    catalog = {path: path.read_bytes() for path in (ROOT / "zoo").rglob("*") if path.is_file()}
    name = zoo.list_entries(DIGITS_DP)[0].name
    entry = build(name, epochs=1, out_dir=tmp_path)
    assert {path: path.read_bytes() for path in (ROOT / "zoo").rglob("*") if path.is_file()} == catalog
    weights = tmp_path / "weights" / entry.file
    assert entry.file == f"{name}-{entry.sha256[:8]}.pth"
    assert hashlib.sha256(weights.read_bytes()).hexdigest() == entry.sha256
    written = yaml.safe_load((tmp_path / "entries" / f"{name}.yaml").read_text())
    assert written == entry.to_dict() and written["status"] == "shipped"
    privacy, recipe = written["meta"]["privacy"], written["meta"]["recipe"]
    assert 2.9 <= privacy["epsilon"] <= 3.0 * 1.005
    assert privacy["steps"] >= 1 and 0 < privacy["sample_rate"] < 1 and privacy["noise_multiplier"] > 0
    assert recipe["overrides"]["trainer.max_epochs"] == 1
    assert recipe["config_sha256"] == config_sha256(recipe["config"])
    local = Zoo(tmp_path, base_url=tmp_path.as_uri(), cache_dir=tmp_path / "cache")
    assert accuracy_of(local.load(name)) == pytest.approx(written["meta"]["metrics"]["test_acc"], abs=1e-6)


@pytest.mark.slow
def test_rebuilding_a_shipped_entry_reproduces_its_metrics(tmp_path):
    """Same recipe: epsilon is exact; test accuracy within 3 points. The shipped digits DP entries were trained with
    ``DPCallback``'s secret randomness, so a rebuild is another draw of masks and noise, not a replay: over five
    draws the recipe gave 93.44 +- 0.67 % (docs/methods/dpsgd.md), and one rebuild landed 2.8 points below the shipped
    93.61 %."""
    shipped = [entry for entry in zoo.list_entries(DIGITS_DP) if entry.status == "shipped"]
    if not shipped:
        pytest.skip("the entry has not been built yet")
    before = shipped[0]
    overrides = before.meta["recipe"]["overrides"] or {}
    epochs = overrides.get("trainer.max_epochs")
    after = build(before.name, epochs=epochs, out_dir=tmp_path)
    assert after.meta["privacy"]["epsilon"] == pytest.approx(before.meta["privacy"]["epsilon"], rel=1e-9)
    assert after.meta["privacy"]["steps"] == before.meta["privacy"]["steps"]
    assert after.meta["metrics"]["test_acc"] == pytest.approx(before.meta["metrics"]["test_acc"], abs=0.03)


def test_the_config_digest_covers_the_base_trainer_config_and_ignores_formatting(tmp_path, monkeypatch):
    """An entry's ``config_sha256`` is of the config ``dprobust fit`` resolves: a change to the base trainer config
    changes it, a comment added to the recipe does not."""
    import lightning_dprobust.recipes as recipes
    import lightning_dprobust.zoo.build as zoo_build

    recipe = "configs/dpsgd/digits.yaml"
    digest = config_sha256(recipe)
    commented = tmp_path / "configs" / "dpsgd" / "digits.yaml"
    commented.parent.mkdir(parents=True)
    commented.write_text("# a comment\n" + (ROOT / recipe).read_text())
    monkeypatch.setattr(zoo_build, "REPO_ROOT", tmp_path)
    assert config_sha256(recipe) == digest
    base = tmp_path / "trainer.yaml"
    base.write_text(recipes.BASE_CONFIG.read_text().replace("save_last: true", "save_last: false"))
    monkeypatch.setattr(recipes, "BASE_CONFIG", base)
    assert config_sha256(recipe) != digest


def test_build_names_its_output_folder_so_the_catalog_is_never_a_default():
    with pytest.raises(TypeError, match="out_dir"):
        build(zoo.list_entries(DIGITS_DP)[0].name, epochs=1)
