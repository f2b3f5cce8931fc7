"""Recipes are composed with ``configs/base/trainer.yaml``: every recipe resolves to the config it spelled out in full
before the base existed, and ``dprobust fit``, :func:`~lightning_dprobust.recipes.build_recipe` (``fit_recipe``) and
:func:`~lightning_dprobust.recipes.composed_config` see the same config. Parsed only: nothing is instantiated."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from lightning_dprobust.recipes import BASE_CONFIG, CONFIG_DIR, DProbustCLI, composed_config

ROOT = Path(__file__).resolve().parents[1]
FULL = "740860d7d8a782c1e80a81f9a51d6d184f699b10"
"""The last commit whose recipes spelled out their trainer, logger and checkpoint settings in full."""
RECIPES = sorted(path for path in CONFIG_DIR.rglob("*.yaml") if path.parent != BASE_CONFIG.parent)
SUBCOMMAND_ONLY = {"config", "ckpt_path", "weights_only", "__default_config__"}
"""Keys a recipe cannot set: the config paths themselves (and the default ones), the checkpoint to resume."""


class ParseOnly(DProbustCLI):
    """``DProbustCLI`` that parses and stops: no class is instantiated, no subcommand runs."""

    def before_instantiate_classes(self) -> None:
        pass

    def instantiate_classes(self) -> None:
        pass

    def _run_subcommand(self, subcommand: str) -> None:
        pass


class WithoutBase(ParseOnly):
    default_config_files = ()


def resolved(config: Path, cli: type[ParseOnly] = ParseOnly, subcommand: bool = False) -> dict[str, Any]:
    """The full config ``cli`` resolves ``config`` to, every default filled in: as ``dprobust fit --config`` does
    (``subcommand``) or as ``build_recipe`` does."""
    if subcommand:
        namespace = cli(args=["fit", "--config", str(config)], run=True).config.fit
    else:
        namespace = cli(args=["--config", str(config)], run=False).config
    return {key: value for key, value in namespace.clone().as_dict().items() if key not in SUBCOMMAND_ONLY}


def name(path: Path) -> str:
    return str(path.relative_to(CONFIG_DIR))


def full_recipe(path: Path, folder: Path) -> Path | None:
    """``path`` as it was at :data:`FULL`, written into ``folder``; ``None`` if it did not exist then."""
    shown = subprocess.run(
        ["git", "show", f"{FULL}:configs/{name(path)}"], cwd=ROOT, capture_output=True, text=True, check=False
    )
    if shown.returncode != 0:
        return None
    written = folder / path.name
    written.write_text(shown.stdout)
    return written


@pytest.fixture(scope="module")
def history() -> None:
    if (
        shutil.which("git") is None
        or subprocess.run(
            ["git", "cat-file", "-e", f"{FULL}^{{commit}}"], cwd=ROOT, capture_output=True, check=False
        ).returncode
    ):
        pytest.skip(f"needs the repository's history (commit {FULL[:9]})")


@pytest.mark.parametrize("path", RECIPES, ids=name)
def test_a_recipe_resolves_as_it_did_when_it_spelled_everything_out(path: Path, tmp_path, history):
    """... and ``dprobust fit``, ``build_recipe`` and ``composed_config`` resolve it alike."""
    now = resolved(path)
    assert resolved(path, subcommand=True) == now
    composed = tmp_path / "composed.yaml"
    composed.write_text(yaml.safe_dump(composed_config(path), sort_keys=False))
    assert resolved(composed, WithoutBase) == now
    before = full_recipe(path, tmp_path)
    if before is None or name(path).startswith("papers/"):
        return  # newer than the base, or a paper kit's recipe: it set no logger or callbacks (its runs turn them off)
    assert now == resolved(before, WithoutBase)


def test_the_base_holds_the_shared_settings_and_no_recipe_repeats_them():
    base = yaml.safe_load(BASE_CONFIG.read_text())["trainer"]
    assert base["logger"]["class_path"].endswith("WandbLogger") and base["callbacks"][0]["init_args"]["save_last"]
    for path in (path for path in RECIPES if not name(path).startswith("papers/")):  # the kits' own settings
        trainer = yaml.safe_load(path.read_text()).get("trainer") or {}
        assert "callbacks" not in trainer and "class_path" not in (trainer.get("logger") or {}), name(path)
        assert "project" not in ((trainer.get("logger") or {}).get("init_args") or {}), name(path)
        assert trainer.get("devices") != base["devices"], f"{name(path)} repeats devices: {base['devices']}"


def test_composed_config_merges_mappings_replaces_lists_and_appends_plus_keys(tmp_path):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(
        "trainer:\n  logger:\n    init_args:\n      name: run\n  callbacks+:\n    - class_path: x.Extra\n"
        "model:\n  class_path: m.M\n"
    )
    trainer = composed_config(recipe)["trainer"]
    assert trainer["logger"]["class_path"].endswith("WandbLogger")
    assert trainer["logger"]["init_args"] == {"project": "dprobust", "log_model": True, "name": "run"}
    assert [callback["class_path"].rsplit(".", 1)[-1] for callback in trainer["callbacks"]] == [
        "ModelCheckpoint",
        "Extra",
    ]
    recipe.write_text(
        "trainer:\n  logger:\n    class_path: l.CSVLogger\n    init_args: {save_dir: s}\n  callbacks: []\n"
    )
    trainer = composed_config(recipe)["trainer"]
    assert (
        trainer["logger"] == {"class_path": "l.CSVLogger", "init_args": {"save_dir": "s"}}
        and trainer["callbacks"] == []
    )
