"""Small builders shared by the tests (imported as ``tests.helpers``)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import lightning as L
import torch
import torch.nn.functional as F

from lightning_dprobust.data import DigitsDataModule
from lightning_dprobust.methods import DPSGD
from lightning_dprobust.models import create_model


def quiet_trainer(tmp_path, **kwargs) -> L.Trainer:
    """A CPU trainer with no logger, progress bar or checkpoints unless asked for."""
    defaults = dict(
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
        num_sanity_val_steps=0,
        limit_val_batches=0,
    )
    return L.Trainer(**(defaults | kwargs))


def digits(batch_size: int = 64, **kwargs) -> DigitsDataModule:
    return DigitsDataModule(batch_size=batch_size, **kwargs)


class ZeroGradient(DPSGD):
    """Every example's loss is constant, so the clipped sum is exactly zero and only the noise remains."""

    def per_example_loss(self, x, y):
        return 0.0 * self(x).sum(dim=1)


class GradientRecorder(L.Callback):
    """Keeps the flat gradient the optimizer applied at each step (``DPCallback`` hands it over inside the step, so
    hooks before the update see ``.grad = None`` in one process)."""

    def __init__(self):
        self.grads = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.grads.append(torch.cat([p.grad.flatten() for p in pl_module.parameters()]).clone())


def trained_digits_classifier() -> tuple[torch.nn.Module, torch.Tensor, torch.Tensor]:
    """cnn_tanh trained non-privately on digits (about a second); returns (model in eval mode, test images, labels)."""
    torch.manual_seed(0)
    data = DigitsDataModule()
    data.setup()
    x, y = data.train_set.tensors
    model = create_model("cnn_tanh", num_classes=10, input_shape=(1, 8, 8), mean=data.mean, std=data.std)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    order = torch.Generator().manual_seed(0)
    for _ in range(8):
        for idx in torch.randperm(len(x), generator=order).split(64):
            optimizer.zero_grad()
            F.cross_entropy(model(x[idx]), y[idx]).backward()
            optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    model.eval()
    return model, *data.test_set.tensors


def wandb_run_file(folder, timeout: float = 30.0):
    """The one offline W&B run file (``wandb/offline-run-*/run-*.wandb``) under ``folder``, waiting up to ``timeout``
    seconds for W&B's service process to create it after ``run.finish()`` (it can lag on a loaded machine)."""
    import time

    deadline = time.monotonic() + timeout
    while not (found := sorted(Path(folder).glob("wandb/offline-run-*/run-*.wandb"))) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert len(found) == 1, f"expected one offline W&B run file under {folder}, found {found}"
    return found[0]


def read_wandb_records(run_file, timeout: float = 30.0) -> list:
    """Decode the records (``wandb_internal_pb2.Record``) of an offline W&B run file (``run-*.wandb``).

    W&B's service process can still be writing the file for a moment after ``run.finish()`` returns (seen with
    wandb 0.31 on a loaded machine), so this waits up to ``timeout`` seconds for the run's ``exit`` record.
    """
    import time

    deadline = time.monotonic() + timeout
    while True:
        records = _decode_wandb_records(run_file)
        if any(record.HasField("exit") for record in records) or time.monotonic() > deadline:
            return records
        time.sleep(0.2)


def _decode_wandb_records(run_file) -> list:
    """The file is a LevelDB-style log (7-byte ``:W&B`` header, 32 KiB blocks, records with a 7-byte header of
    crc32c, little-endian length and type) of ``wandb_internal_pb2.Record`` messages."""
    import struct

    from wandb.proto import wandb_internal_pb2

    data = open(run_file, "rb").read()  # noqa: SIM115
    assert data[:4] == b":W&B", "not a W&B run file"
    block, position, pending, records = 32768, 7, b"", []
    while position + 7 <= len(data):
        if block - position % block < 7:  # block trailer too short for a header: skip to the next block
            position += block - position % block
            continue
        length, kind = struct.unpack("<HB", data[position + 4 : position + 7])
        pending += data[position + 7 : position + 7 + length]
        position += 7 + length
        if kind in (1, 4):  # FULL or LAST
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            pending = b""
            records.append(record)
    return records


def _items(items) -> dict:
    import json

    return {"/".join(item.nested_key) or item.key: json.loads(item.value_json) for item in items}


def read_wandb_history(run_file) -> list[dict]:
    """The history rows (``log`` calls) of an offline W&B run file."""
    return [_items(record.history.item) for record in read_wandb_records(run_file) if record.HasField("history")]


def read_wandb_config_and_summary(run_file) -> tuple[dict, dict]:
    """The run config and the summary written to an offline W&B run file (later updates win)."""
    config, summary = {}, {}
    for record in read_wandb_records(run_file):
        if record.HasField("config"):
            config |= _items(record.config.update)
        if record.HasField("summary"):
            summary |= _items(record.summary.update)
    return config, summary


def run_ranks(script, out_dir, devices: int, *args: str) -> list[dict]:
    """Run ``python script out_dir devices *args`` (a gloo DDP script that saves ``rank{r}.pt`` per rank) with this
    checkout on the path; returns the ranks' saved results. Fails with the script's stderr if it exits non-zero."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    env = os.environ | {"PYTHONPATH": str(root), "OMP_NUM_THREADS": "1"}
    command = [sys.executable, str(script), str(out_dir), str(devices), *map(str, args)]
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]
    return [torch.load(Path(out_dir) / f"rank{rank}.pt", weights_only=True) for rank in range(devices)]


def load_benchmark(script: str) -> ModuleType:
    """``benchmarks/<script>.py`` as a module. benchmarks/ is a folder of scripts, not a package (an installed
    "benchmarks" package may exist), whose scripts import their siblings by name: loaded by path, with the folder on
    ``sys.path`` while the script runs its imports."""
    folder = Path(__file__).resolve().parents[1] / "benchmarks"
    spec = importlib.util.spec_from_file_location(f"dprobust_benchmark_{script}", folder / f"{script}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve their module through sys.modules
    sys.path.insert(0, str(folder))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(folder))
    return module


def seeded_by_32_bits(generator: torch.Generator) -> bool:
    """Whether a fresh CPU generator's Mersenne Twister state is the initialization of a 32-bit seed, i.e. one of the
    2^32 states ``manual_seed`` can give (each word follows from the previous one; the first is the seed's low 32
    bits). Read independently of the library: the 624 words sit at byte 24 of ``get_state()``, 8 bytes each."""
    words = generator.get_state()[24 : 24 + 8 * 624].view(torch.int64).tolist()
    expected = words[0]
    for index in range(1, 624):
        expected = (1812433253 * (expected ^ (expected >> 30)) + index) & 0xFFFFFFFF
        if words[index] != expected:
            return False
    return True


def recording_labels(generator: torch.nn.Module) -> list[torch.Tensor]:
    """Record the conditioning labels of every pass of an AIN generator (its ``forward(x, labels, ...)``)."""
    seen, forward = [], generator.forward

    def record(x, labels, *args, **kwargs):
        seen.append(labels.clone())
        return forward(x, labels, *args, **kwargs)

    generator.forward = record
    return seen
