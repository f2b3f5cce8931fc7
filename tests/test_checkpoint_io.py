"""Crash-safe checkpoint files: a failed or killed save keeps the previous file; bad files give one clear error."""

from __future__ import annotations

import io
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch import nn

from lightning_dprobust import checkpoint_io
from lightning_dprobust.callbacks import DPCallback
from lightning_dprobust.checkpoint_io import (
    AtomicCheckpointIO,
    CheckpointError,
    atomic_save,
    check_state_dict_fits,
    read_checkpoint,
)
from lightning_dprobust.methods import DPSGD
from tests.helpers import digits, quiet_trainer

ROOT = Path(__file__).resolve().parents[1]
OLD = {"state_dict": {"w": torch.arange(1000.0)}, "epoch": 1}
NEW = {"state_dict": {"w": -torch.arange(1000.0)}, "epoch": 2}


def same(a: dict, b: dict) -> bool:
    return a["epoch"] == b["epoch"] and torch.equal(a["state_dict"]["w"], b["state_dict"]["w"])


def crash_half_way(monkeypatch):
    """Make ``torch.save`` write the first half of the real bytes to its stream, then fail as a full disk does."""
    real_save = torch.save

    def save(obj, stream, *args, **kwargs):
        if isinstance(stream, (str, os.PathLike)):
            stream = open(stream, "wb")  # noqa: SIM115 (left open, as by a process that dies while writing)
        buffer = io.BytesIO()
        real_save(obj, buffer)
        stream.write(buffer.getvalue()[: len(buffer.getvalue()) // 2])
        stream.flush()
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(torch, "save", save)


# ---------------------------------------------------------------------------------------------- atomic writes
def test_a_save_failing_half_way_keeps_the_previous_checkpoint_and_leaves_no_temporary(tmp_path, monkeypatch):
    path = tmp_path / "last.ckpt"
    AtomicCheckpointIO().save_checkpoint(OLD, path)
    crash_half_way(monkeypatch)
    with pytest.raises(OSError, match="No space left"):
        AtomicCheckpointIO().save_checkpoint(NEW, path)
    monkeypatch.undo()
    assert same(torch.load(path, weights_only=True), OLD)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt"]


def test_the_same_crash_truncates_a_checkpoint_written_in_place(tmp_path, monkeypatch):
    """Control: the simulated crash does destroy a file written directly under its final name."""
    path = tmp_path / "last.ckpt"
    torch.save(OLD, path)
    crash_half_way(monkeypatch)
    with pytest.raises(OSError):
        torch.save(NEW, path)
    monkeypatch.undo()
    with pytest.raises(CheckpointError, match="truncated"):
        read_checkpoint(path)


@pytest.mark.skipif(sys.platform != "linux", reason="reads file names of descriptors from /proc")
def test_the_temporary_file_is_fsynced_in_the_target_folder_then_renamed(tmp_path, monkeypatch):
    """A same-folder temporary makes the rename atomic; fsync before it makes the content durable."""
    events = []
    real_fsync, real_replace = os.fsync, os.replace
    monkeypatch.setattr(
        os, "fsync", lambda fd: (events.append(("fsync", Path(f"/proc/self/fd/{fd}").resolve())), real_fsync(fd))
    )
    monkeypatch.setattr(
        os, "replace", lambda src, dst: (events.append(("replace", Path(src), Path(dst))), real_replace(src, dst))
    )
    target = tmp_path / "run" / "last.ckpt"
    atomic_save(NEW, target)
    (kind1, synced), (kind2, source, destination), (kind3, folder) = events
    assert (kind1, kind2, kind3) == ("fsync", "replace", "fsync")
    assert synced == source.resolve() and source.parent == target.parent and destination == target
    assert folder == target.parent.resolve()
    assert same(torch.load(target, weights_only=True), NEW)


@pytest.mark.slow
def test_a_killed_writer_always_leaves_a_complete_checkpoint(tmp_path):
    """SIGKILL a process that saves large checkpoints in a loop: the file under the final name always loads."""
    script = (
        "import sys, torch; from lightning_dprobust.checkpoint_io import atomic_save\n"
        "big = [torch.full((1_500_000,), float(v)) for v in range(2)]\n"
        "atomic_save({'v': big[0]}, sys.argv[1]); print('ready', flush=True)\n"
        "i = 0\n"
        "while True:\n"
        "    i += 1; atomic_save({'v': big[i % 2]}, sys.argv[1])\n"
    )
    target = tmp_path / "last.ckpt"
    env = os.environ | {"PYTHONPATH": str(ROOT)}
    writer = subprocess.Popen([sys.executable, "-c", script, str(target)], stdout=subprocess.PIPE, text=True, env=env)
    assert writer.stdout.readline().strip() == "ready"
    time.sleep(0.3)
    writer.send_signal(signal.SIGKILL)
    writer.wait(timeout=30)
    value = torch.load(target, weights_only=True)["v"]
    assert value.shape == (1_500_000,) and value[0].item() in (0.0, 1.0) and bool((value == value[0]).all())


# -------------------------------------------------------------------------------------------------- reads
def evil_payload(marker: Path) -> object:
    class Evil:
        def __reduce__(self):
            return (open, (str(marker), "w"))  # creates the marker file if it is ever unpickled

    return {"state_dict": {}, "payload": Evil()}


@pytest.mark.parametrize(
    ("write", "message"),
    [
        (lambda p: p.write_bytes(b""), "truncated, damaged or not a PyTorch checkpoint"),
        (lambda p: p.write_text("hello\n"), "not a PyTorch checkpoint"),
        (lambda p: p.write_bytes(random.randbytes(4096)), "not a PyTorch checkpoint"),
        (lambda p: (torch.save(NEW, p), p.write_bytes(p.read_bytes()[:3000])), "truncated"),
        (lambda p: torch.save([1, 2], p), "holds a list, not a checkpoint dictionary"),
        (lambda p: torch.save(evil_payload(p.with_name("pwned")), p), r"refusing to load .*\((builtins|_?io)\.open\)"),
    ],
    ids=["empty", "text", "random-bytes", "truncated", "not-a-dict", "pickled-code"],
)
@pytest.mark.parametrize("seed", range(20))  # random bytes break the unpickler in many ways; each is one error
def test_bad_files_raise_one_checkpoint_error_naming_the_file(tmp_path, write, message, seed):
    random.seed(seed)
    path = tmp_path / "bad.ckpt"
    write(path)
    with pytest.raises(CheckpointError, match=message) as caught:
        read_checkpoint(path)
    assert str(path) in str(caught.value)
    assert not (tmp_path / "pwned").exists()


def test_a_missing_file_is_a_file_not_found_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        read_checkpoint(tmp_path / "nope.ckpt")


def test_check_state_dict_fits_names_missing_unexpected_and_resized_tensors():
    model = nn.Sequential(nn.Linear(4, 3), nn.Linear(3, 2))
    check_state_dict_fits(model, model.state_dict(), "ok.ckpt")
    other = nn.Sequential(nn.Linear(4, 5), nn.Linear(5, 2), nn.Linear(2, 2)).state_dict()
    with pytest.raises(CheckpointError) as caught:
        check_state_dict_fits(model, other, "other.ckpt")
    message = str(caught.value)
    assert "unexpected: 2.bias, 2.weight" in message
    assert "0.weight (5, 4) vs (3, 4)" in message and "hyper_parameters" in message
    with pytest.raises(CheckpointError, match=r"missing: 1.bias, 1.weight"):
        check_state_dict_fits(model, {k: v for k, v in model.state_dict().items() if k.startswith("0.")}, "x")


# ------------------------------------------------------------------------------------------ with a Trainer
def fit(tmp_path, ckpt_path=None, max_steps=4):
    torch.manual_seed(0)
    module = DPSGD(model="cnn_tanh", num_classes=10, input_shape=(1, 8, 8), lr=0.5)
    checkpoint = ModelCheckpoint(dirpath=tmp_path / "ckpt", save_last=True, every_n_train_steps=2)
    trainer = quiet_trainer(
        tmp_path,
        max_steps=max_steps,
        plugins=[AtomicCheckpointIO()],
        enable_checkpointing=True,
        callbacks=[DPCallback(noise_multiplier=1.0), checkpoint],
    )
    trainer.fit(module, digits(batch_size=128), ckpt_path=ckpt_path)
    return trainer


def spy(monkeypatch, name: str, path_argument: int, calls: list) -> None:
    """Record ``(name, file name)`` at each call of ``checkpoint_io.<name>``, then run the real function."""
    real = getattr(checkpoint_io, name)

    def recorded(*args, **kwargs):
        calls.append((name, Path(args[path_argument]).name))
        return real(*args, **kwargs)

    monkeypatch.setattr(checkpoint_io, name, recorded)


def test_the_trainer_saves_and_resumes_through_the_plugin(tmp_path, monkeypatch):
    calls = []
    spy(monkeypatch, "atomic_save", 1, calls)
    spy(monkeypatch, "read_checkpoint", 0, calls)
    fit(tmp_path)
    assert ("atomic_save", "last.ckpt") in calls
    assert fit(tmp_path, ckpt_path=tmp_path / "ckpt" / "last.ckpt", max_steps=6).global_step == 6
    assert ("read_checkpoint", "last.ckpt") in calls and calls[-1] == ("atomic_save", "last.ckpt")


def test_resuming_from_a_truncated_checkpoint_is_one_clear_error(tmp_path):
    fit(tmp_path)
    path = tmp_path / "ckpt" / "last.ckpt"
    path.write_bytes(path.read_bytes()[:5000])
    with pytest.raises(CheckpointError, match="earlier checkpoint"):
        fit(tmp_path, ckpt_path=path, max_steps=6)
