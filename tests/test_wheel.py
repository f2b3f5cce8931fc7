"""A wheel (``pip install .``, not editable) carries the zoo catalog, its weights and the configs: built from a copy
of the source, installed into a fresh folder, it lists the zoo and fits one epoch from an installed config."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ("pyproject.toml", "setup.py", "README.md", "lightning_dprobust", "zoo", "configs")


def run(*command: str, cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    result = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    return result


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """The wheel installed (without dependencies: the test environment has them) into a fresh folder."""
    work = tmp_path_factory.mktemp("wheel")
    source = work / "source"
    source.mkdir()
    for name in SOURCES:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(ROOT / name, source / name)
    pip = [sys.executable, "-m", "pip"]
    run(*pip, "wheel", ".", "--no-deps", "--no-build-isolation", "-q", "-w", str(work / "dist"), cwd=source)
    (wheel,) = (work / "dist").glob("lightning_dprobust-*.whl")
    run(*pip, "install", "--no-deps", "-q", "--target", str(work / "site"), str(wheel), cwd=work)
    return work / "site"


def dprobust(site: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess:
    env = os.environ | {"PYTHONPATH": str(site), "WANDB_MODE": "offline", "OMP_NUM_THREADS": "1"}
    code = "import sys, lightning_dprobust; from lightning_dprobust.cli import main; " \
           "print('package:', lightning_dprobust.__file__); sys.exit(main(sys.argv[1:]))"  # fmt: skip
    return run(sys.executable, "-c", code, *args, cwd=cwd, env=env)


@pytest.mark.slow
def test_the_installed_wheel_lists_the_zoo_and_fits_from_an_installed_config(installed, tmp_path):
    listed = dprobust(installed, tmp_path, "zoo", "list")
    assert f"package: {installed}" in listed.stdout  # the installed copy, not the source checkout
    assert "mlp_tanh.dpsgd_digits_eps3" in listed.stdout and "shipped" in listed.stdout
    config = installed / "lightning_dprobust" / "_data" / "configs" / "dpsgd" / "digits.yaml"
    fitted = dprobust(installed, tmp_path, "fit", "--config", str(config), "--trainer.max_epochs", "1",
                      "--trainer.logger", "false", "--trainer.enable_progress_bar", "false")  # fmt: skip
    assert "fit done: epsilon" in fitted.stdout
    assert list(tmp_path.glob("runs/dpsgd-digits/**/last.ckpt"))
