"""Kill ``dprobust fit`` with SIGKILL between two checkpoints, resume from ``last.ckpt``, compare to an unbroken run.

The epsilon of a run is computed over the steps in its checkpointed history. Steps taken after the last checkpoint
and before the kill are lost with the process: their parameters were never saved or published, so they released
nothing, and the resumed run takes them again (on the same Poisson batches) and counts them once.
"""

from __future__ import annotations

import copy
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml

from lightning_dprobust.cli import main
from lightning_dprobust.core.accounting import PrivacyLedger
from lightning_dprobust.recipes import composed_config
from tests.crash_helpers import read_steps

ROOT = Path(__file__).resolve().parents[1]
CONFIG = composed_config(ROOT / "configs" / "dpsgd" / "digits.yaml")
EPOCHS, STEPS_PER_EPOCH, EVERY, KILL_AT = 3, 5, 3, 7  # batch 256 of 1,293 digits: 5 Poisson steps per epoch
CHECKPOINTS = Path("runs") / "dpsgd-digits" / "checkpoints"


def write_config(run_dir: Path, log_name: str, pause_at_step: int | None = None) -> Path:
    """The shipped DP-SGD digits config, shortened, seeded, with step checkpoints and a step recorder."""
    config = copy.deepcopy(CONFIG)
    trainer = config["trainer"]
    trainer.update(max_epochs=EPOCHS, logger=False, enable_progress_bar=False, limit_val_batches=0)
    checkpoint = next(c for c in trainer["callbacks"] if c["class_path"].endswith("ModelCheckpoint"))
    checkpoint["init_args"].update(every_n_train_steps=EVERY, save_last=True)
    config["dp"]["seed"] = 0  # reproducibility mode: a resume continues the masks and noise of the run
    recorder = {"log_path": str(run_dir / log_name), "pause_at_step": pause_at_step}
    trainer["callbacks"].append({"class_path": "tests.crash_helpers.StepRecorder", "init_args": recorder})
    path = run_dir / f"{log_name}.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def start_fit(run_dir: Path, config: Path) -> subprocess.Popen:
    """``dprobust fit`` in a separate process, so that it can be killed."""
    env = os.environ | {"PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "WANDB_MODE": "offline"}
    command = [str(Path(sys.executable).with_name("dprobust")), "fit", "--config", str(config)]
    with (run_dir / "stderr.txt").open("w") as stderr:  # a file, not a pipe that could fill up and block the run
        return subprocess.Popen(command, cwd=run_dir, env=env, stdout=subprocess.DEVNULL, stderr=stderr)


def fit_here(run_dir: Path, config: Path, *extra: str) -> None:
    """``dprobust fit`` in this process (the same code path, without a second interpreter start)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(run_dir)
        assert main(["fit", "--config", str(config), *extra]) == 0


def kill_when_paused(process: subprocess.Popen, marker: Path, timeout_s: float = 300) -> None:
    deadline = time.monotonic() + timeout_s
    while not marker.exists():
        assert process.poll() is None, (marker.parent / "stderr.txt").read_text()[-3000:]
        assert time.monotonic() < deadline, "the run never reached the pause step"
        time.sleep(0.05)
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=30)
    assert process.returncode == -signal.SIGKILL


def load_last(run_dir: Path) -> dict:
    return torch.load(run_dir / CHECKPOINTS / "last.ckpt", weights_only=True)


def epsilon_of(checkpoint: dict) -> float:
    state = checkpoint["callbacks"]["DPCallback"]
    return PrivacyLedger(_history(checkpoint)).epsilon(state["delta"], state["accountant"])


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    """An unbroken run and a run killed after step KILL_AT (last checkpoint at step 6), then resumed."""
    unbroken_dir, broken_dir = tmp_path_factory.mktemp("unbroken"), tmp_path_factory.mktemp("broken")
    killed = start_fit(broken_dir, write_config(broken_dir, "killed.jsonl", pause_at_step=KILL_AT))
    try:
        fit_here(unbroken_dir, write_config(unbroken_dir, "steps.jsonl"))
        kill_when_paused(killed, broken_dir / "killed.jsonl.paused")
    finally:
        if killed.poll() is None:  # a failure above must not leave the paused process behind
            killed.kill()
            killed.wait(timeout=30)
    at_kill = load_last(broken_dir)
    fit_here(broken_dir, write_config(broken_dir, "resumed.jsonl"), "--ckpt_path", str(CHECKPOINTS / "last.ckpt"))
    return {
        "unbroken": load_last(unbroken_dir),
        "at_kill": at_kill,
        "resumed": load_last(broken_dir),
        "unbroken_steps": read_steps(unbroken_dir / "steps.jsonl"),
        "killed_steps": read_steps(broken_dir / "killed.jsonl"),
        "resumed_steps": read_steps(broken_dir / "resumed.jsonl"),
    }


def test_the_checkpoint_at_the_kill_counts_exactly_the_steps_in_its_parameters(runs):
    at_kill = runs["at_kill"]
    last_saved = KILL_AT // EVERY * EVERY
    assert max(runs["killed_steps"]) == KILL_AT - 1  # the process trained past its last checkpoint
    assert at_kill["global_step"] == last_saved
    assert PrivacyLedger(_history(at_kill)).steps == last_saved


def test_the_resumed_run_reports_exactly_the_epsilon_of_an_unbroken_run(runs):
    unbroken, resumed = runs["unbroken"], runs["resumed"]
    assert resumed["global_step"] == unbroken["global_step"] == EPOCHS * STEPS_PER_EPOCH
    assert _history(resumed) == _history(unbroken)
    assert PrivacyLedger(_history(resumed)).steps == resumed["global_step"]  # every published step is counted
    assert epsilon_of(resumed) == epsilon_of(unbroken)
    assert 0 < epsilon_of(resumed) <= CONFIG["dp"]["target_epsilon"]


def test_the_resumed_run_redoes_the_lost_steps_on_the_batches_of_an_unbroken_run(runs):
    """Each step must draw a fresh Poisson batch: the accountant assumes independent batches at every step."""
    last_saved = runs["at_kill"]["global_step"]
    assert min(runs["resumed_steps"]) == last_saved
    history = {step: batch for step, batch in runs["killed_steps"].items() if step < last_saved}
    history |= runs["resumed_steps"]
    assert history == runs["unbroken_steps"]
    assert len(set(history.values())) == len(history), "a Poisson batch was drawn twice"


def _history(checkpoint: dict) -> list:
    return [tuple(event) for event in checkpoint["callbacks"]["DPCallback"]["ledger"]["history"]]
