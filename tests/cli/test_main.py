"""The ``dprobust`` command: a real fit from the shipped config, W&B offline logs, and bad configs."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from lightning_dprobust.cli import main
from tests.helpers import read_wandb_history

ROOT = Path(__file__).resolve().parents[2]
DPSGD_DIGITS = ROOT / "configs" / "dpsgd" / "digits.yaml"


def dprobust(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    script = Path(sys.executable).with_name("dprobust")
    env = os.environ | {"WANDB_MODE": "offline", "WANDB_SILENT": "true"}
    env.pop("WANDB_SERVICE", None)  # an in-process wandb.init of an earlier test must not leak into the child
    return subprocess.run([str(script), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def test_fit_from_the_shipped_config_exits_zero_and_logs_epsilon_to_wandb(tmp_path):
    result = dprobust("fit", "--config", str(DPSGD_DIGITS), "--trainer.max_epochs", "1", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    run_files = list(tmp_path.glob("runs/dpsgd-digits/wandb/offline-run-*/run-*.wandb"))
    assert len(run_files) == 1
    rows = read_wandb_history(run_files[0])
    epsilons = [row["privacy/epsilon"] for row in rows if "privacy/epsilon" in row]
    accuracies = [row["val/acc"] for row in rows if "val/acc" in row]
    assert len(epsilons) == 1 and 0 < epsilons[0] < 3.0
    assert accuracies and 0.0 <= accuracies[-1] <= 1.0
    assert list(tmp_path.glob("runs/dpsgd-digits/**/last.ckpt"))


def write_config(tmp_path: Path, edit) -> Path:
    config = yaml.safe_load(DPSGD_DIGITS.read_text())
    edit(config)
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def dp_args(config: dict) -> dict:
    return config["dp"]


def run_main(tmp_path, monkeypatch, *args: str) -> int:
    monkeypatch.chdir(tmp_path)
    try:
        return main(list(args))
    except SystemExit as exit_:  # jsonargparse exits on parse errors
        return exit_.code


@pytest.mark.parametrize(
    ("edit", "key"),
    [
        (lambda c: dp_args(c).update(target_epsilon=None, noise_multiplier=-1.0), "noise_multiplier"),
        (lambda c: dp_args(c).update(target_epsilon=1e-6), "target_epsilon"),
        (lambda c: dp_args(c).update(max_grad_norm=0.0), "max_grad_norm"),
        (lambda c: c["model"]["init_args"].update(lr=-0.1), "lr"),
        (lambda c: c["data"]["init_args"].update(batch_size=5000), "batch_size"),
    ],
)
def test_bad_values_exit_nonzero_naming_the_key(tmp_path, monkeypatch, capsys, edit, key):
    config = write_config(tmp_path, edit)
    code = run_main(
        tmp_path, monkeypatch, "fit", "--config", str(config), "--trainer.max_epochs", "1", "--trainer.logger", "false"
    )
    assert code != 0
    message = capsys.readouterr().err
    assert key in message
    assert "Traceback" not in message


def test_unknown_key_exits_nonzero_naming_it(tmp_path, monkeypatch, capsys):
    config = write_config(tmp_path, lambda c: c["model"]["init_args"].update(learning_rate=0.1))
    assert run_main(tmp_path, monkeypatch, "fit", "--config", str(config)) != 0
    assert "learning_rate" in capsys.readouterr().err


def test_missing_config_file_exits_nonzero_naming_it(tmp_path, monkeypatch, capsys):
    assert run_main(tmp_path, monkeypatch, "fit", "--config", "no_such_config.yaml") != 0
    assert "no_such_config.yaml" in capsys.readouterr().err


def test_a_full_disk_is_one_line_that_says_so_and_what_stays_valid(monkeypatch, capsys):
    """A write that fails for lack of space (a checkpoint, W&B's files, a CSV) ends in one line naming the file, not in
    the bare errno text or a traceback."""

    def full(name, args):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "/runs/fit/last.ckpt")

    monkeypatch.setattr(sys.modules["lightning_dprobust.cli.main"], "_run_subcommand", full)
    assert main(["certify", "--ckpt_path", "x"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("dprobust: error: the disk is full (No space left on device) while writing /runs/fit/")
    assert "checkpoints written before stay valid" in line
