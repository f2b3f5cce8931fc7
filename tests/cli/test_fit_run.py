"""``dprobust fit`` as a newcomer runs it: epsilon from the command line (the ``dp`` group), the end-of-fit summary,
the W&B run's config and summary, one run per folder, a resume that continues the same W&B run, and fits that stop
with one clear error (non-finite loss, absurd sample rate, no last checkpoint)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
import yaml

from lightning_dprobust.callbacks.run import privacy_curve
from lightning_dprobust.cli import main
from lightning_dprobust.core.accounting import PrivacyEvent, epsilon_for
from lightning_dprobust.recipes import composed_config
from tests.cli.test_main import DPSGD_DIGITS, dprobust
from tests.helpers import read_wandb_config_and_summary, read_wandb_records

SUMMARY = re.compile(
    r"fit done: epsilon ([0-9.]+) at delta ([0-9.e-]+) \((\w+) accountant\), (\d+) steps; best val/acc"
)
RUN = Path("runs") / "dpsgd-digits"


def wandb_runs(folder: Path) -> list[Path]:
    return sorted(folder.glob(f"{RUN}/wandb/offline-run-*/run-*.wandb"))


@pytest.fixture(scope="module")
def first_fit(tmp_path_factory):
    """One epoch of the shipped DP-SGD digits config at epsilon 1 instead of its 3, set on the command line."""
    folder = tmp_path_factory.mktemp("fit")
    result = dprobust("fit", "--config", str(DPSGD_DIGITS), "--dp.target_epsilon", "1.0", "--trainer.max_epochs", "1",
                      cwd=folder)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    return folder, result


def test_the_dp_group_sets_epsilon_and_the_fit_ends_with_one_summary_line(first_fit):
    _, result = first_fit
    (line,) = [line for line in result.stdout.splitlines() if line.startswith("fit done:")]
    epsilon, delta, accountant, steps = SUMMARY.match(line).groups()
    assert 0.99 <= float(epsilon) <= 1.0  # calibrated to the command line's target, not the config's 3.0
    assert (float(delta), accountant) == (1e-5, "rdp") and int(steps) >= 1


def test_the_wandb_run_holds_the_dp_and_data_parameters_and_the_final_epsilon(first_fit):
    folder, result = first_fit
    (run_file,) = wandb_runs(folder)
    config, summary = read_wandb_config_and_summary(run_file)
    assert config["dp"]["init_args"]["target_epsilon"] == 1.0
    assert config["data"]["init_args"]["batch_size"] == 256 and config["seed_everything"] == 0
    privacy = config["privacy"]
    assert privacy["noise_multiplier"] > 0 and privacy["max_grad_norm"] == 1.0 and privacy["accountant"] == "rdp"
    assert 0 < privacy["sample_rate"] < 1
    printed = float(SUMMARY.search(result.stdout).group(1))
    assert summary["privacy/final_epsilon"] == pytest.approx(printed, rel=1e-3)
    artifacts = [record.artifact for record in read_wandb_records(run_file) if record.HasField("artifact")]
    assert any(a.type == "model" and "model.ckpt" in [m.path for m in a.manifest.contents] for a in artifacts)


def test_the_fit_writes_the_privacy_curve_and_logs_it_to_wandb(first_fit):
    folder, result = first_fit
    (png,) = (folder / RUN).rglob("privacy_curve.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    (run_file,) = wandb_runs(folder)
    history = [record.history for record in read_wandb_records(run_file) if record.HasField("history")]
    assert any(item.key == "privacy/epsilon_curve" or "epsilon_curve" in "/".join(item.nested_key)
               for row in history for item in row.item)  # fmt: skip


def test_the_privacy_curve_rises_to_the_final_epsilon():
    history = [PrivacyEvent(2.0, 0.1, 30), PrivacyEvent(1.5, 0.1, 10)]
    curve = privacy_curve(history, 1e-5, "rdp", points=8)
    steps, epsilons = zip(*curve, strict=True)
    assert steps[-1] == 40 and list(steps) == sorted(steps)
    assert all(a < b for a, b in zip(epsilons, epsilons[1:], strict=False))
    assert epsilons[-1] == pytest.approx(epsilon_for(history, 1e-5, "rdp"))
    assert epsilons[3] == pytest.approx(epsilon_for([(2.0, 0.1, 20)], 1e-5, "rdp"))


def test_a_second_fit_into_the_folder_is_refused_and_a_resume_continues_the_same_wandb_run(first_fit):
    folder, _ = first_fit
    config_yaml = (folder / RUN / "config.yaml").read_text()
    again = dprobust("fit", "--config", str(DPSGD_DIGITS), "--trainer.max_epochs", "1", cwd=folder)
    assert again.returncode == 2 and "already exists" in again.stderr and "--ckpt_path last" in again.stderr
    assert len(wandb_runs(folder)) == 1 and (folder / RUN / "config.yaml").read_text() == config_yaml
    resumed = dprobust("fit", "--config", str(DPSGD_DIGITS), "--dp.target_epsilon", "1.0", "--trainer.max_epochs", "2",
                       "--ckpt_path", "last", cwd=folder)  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    first, second = wandb_runs(folder)
    assert first.name == second.name  # run-<id>.wandb: the same W&B run id
    assert (folder / RUN / "config.yaml").read_text() == config_yaml
    (last,) = folder.glob(f"{RUN}/dprobust/*/checkpoints/last.ckpt")
    assert torch.load(last, weights_only=True)["epoch"] == 1  # the second epoch was trained on top of the first


def fit_here(tmp_path, monkeypatch, *args: str, edit=None) -> int:
    config = composed_config(DPSGD_DIGITS)
    config["trainer"].update(logger=False, enable_progress_bar=False, default_root_dir=str(tmp_path / "run"))
    if edit:
        edit(config)
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(config))
    monkeypatch.chdir(tmp_path)
    return main(["fit", "--config", str(path), "--trainer.max_epochs", "1", *args])


def test_an_infinite_learning_rate_stops_training_before_a_checkpoint_is_written(tmp_path, monkeypatch, capsys):
    assert (
        fit_here(tmp_path, monkeypatch, edit=lambda config: config["model"]["init_args"].update(lr=float("inf"))) == 2
    )
    (error,) = [line for line in capsys.readouterr().err.splitlines() if line.startswith("dprobust: error:")]
    assert error.startswith("dprobust: error: training stopped at epoch 0") and "non-finite" in error
    assert not list(tmp_path.rglob("*.ckpt"))


def test_a_sample_rate_below_one_expected_example_is_refused(tmp_path, monkeypatch, capsys):
    assert fit_here(tmp_path, monkeypatch, "--dp.sample_rate", "1e-6") == 2
    (error,) = [line for line in capsys.readouterr().err.splitlines() if line.startswith("dprobust: error:")]
    assert "sample_rate=1e-06" in error and "1,000,000 steps per epoch" in error


def test_ckpt_path_last_without_a_checkpoint_is_refused(tmp_path, monkeypatch, capsys):
    assert fit_here(tmp_path, monkeypatch, "--ckpt_path", "last") == 2
    assert "--ckpt_path last: no last checkpoint" in capsys.readouterr().err


def test_dp_null_trains_without_dp_and_says_so(tmp_path, monkeypatch, capsys):
    assert fit_here(tmp_path, monkeypatch, "--dp", "null") == 0
    assert "fit done: no DP (epsilon = inf); best val/acc" in capsys.readouterr().out


def test_a_dpcallback_in_trainer_callbacks_is_refused_pointing_at_the_dp_group(tmp_path, monkeypatch, capsys):
    def move(config):
        dp = config.pop("dp")
        config["trainer"]["callbacks"].append(
            {"class_path": "lightning_dprobust.callbacks.DPCallback", "init_args": dp}
        )

    assert fit_here(tmp_path, monkeypatch, edit=move) == 2
    assert "DPCallback belongs in the `dp` group" in capsys.readouterr().err
