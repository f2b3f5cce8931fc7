"""The shared runner of the paper reproduction kits (``benchmarks/papers/<paper>.py``).

A kit is a :class:`Kit`: the grid of one paper's main table as :class:`Cell` s (datasets, epsilons, methods,
hyperparameters), each trained through the shipped recipes (``configs/``,
:func:`lightning_dprobust.recipes.build_recipe`, the path of ``dprobust fit``) and evaluated, with the paper's
numbers for that cell transcribed from the paper (labelled "paper", with the table or figure and its section: the
text sources carry no page numbers). :func:`main` runs a kit from the command line:

* real mode (default): the paper's data (``$DPROBUST_DATA`` or ``--data-root``), paper-sized models, the paper's
  epochs; results go to ``results/papers/<paper>/``;
* ``--smoke``: the whole grid on tiny fake data written in the real file formats (idx files for MNIST and
  Fashion-MNIST, CIFAR pickles, IDC PNG folders, MIMIC-IV-ED CSVs; the embedded digits and synthetic EHR sets where
  a kit uses them), tiny models, 1-2 optimizer steps per cell, into a temporary folder unless ``--out`` is given;
* ``--estimate``: trains each distinct real-mode recipe of the grid for a few steps on fake data of the real shape
  and batch size, times the steps on this CPU and prints the real run's **estimated** GPU time (see
  :func:`estimate`).

Every cell writes one result file (:func:`benchmarks.results.write_result`: ``<paper>__<cell>.json``) with its
metrics beside the paper's; the kit writes the grid as a markdown table (``<paper>.md``) and as a result file
(``<paper>.json``). A cell that cannot run in a mode (e.g. a method the library lacks) is listed with the reason.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import math
import pickle
import re
import struct
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch
import yaml
from torch.utils.data import Subset

HERE = Path(__file__).resolve().parent
sys.path[:0] = [p for p in (str(HERE.parent), str(HERE)) if p not in sys.path]

from seeds import quiet_training, seeded_config, spread_cell  # noqa: E402

from lightning_dprobust.recipes import CONFIG_DIR, FittedRecipe, build_recipe, find_dp_callback  # noqa: E402
from lightning_dprobust.robustness.reports import markdown_table  # noqa: E402
from results import RESULTS_DIR, write_result  # noqa: E402

PAPER_CONFIGS = CONFIG_DIR / "papers"
"""Recipes the kits add to the shipped ones (``configs/papers/<paper>/``): paper-sized models, pre-training stages,
the paper's budgets where a shipped recipe deviates."""

GPU_SPEEDUP = 25.0
"""Assumed speed-up of one H100/A100-class GPU over one core of this machine's CPU for these small convolutional
and transformer models (an assumption, not a measurement: see :func:`estimate`)."""

SMOKE_TRAINER = [
    "--trainer.max_steps=2",
    "--trainer.max_epochs=1",
    "--trainer.limit_val_batches=0",
    "--trainer.limit_test_batches=1",
    "--trainer.num_sanity_val_steps=0",
]


# ------------------------------------------------------------------------------------------------------------ grid
@dataclass
class Cell:
    """One cell of a paper's grid.

    Attributes:
        key: unique file-name-safe id (``mnist_eps0.2_dpadv``).
        labels: the cell's row labels, one per :attr:`Kit.label_columns`.
        run: ``run(context, seed) -> metrics`` (fractions for accuracies, as measured).
        paper: the paper's number per metric (strings as printed in the paper); missing metrics print ``-``.
        note: what differs from the paper in this cell, or why it is not run.
        skip: reason the cell is not run by this library (listed in the table, no result file).
        real_steps: optimizer steps of the real-mode training (for :func:`estimate`).
        timing_key: cells sharing a key share one timing (same recipe and model).
    """

    key: str
    labels: Sequence[str]
    run: Callable[[Context, int], dict[str, float]] | None
    paper: Mapping[str, str] = field(default_factory=dict)
    note: str = ""
    skip: str = ""
    real_steps: int = 0
    timing_key: str = ""


@dataclass
class Kit:
    """A paper's reproduction kit: its grid and how to print it."""

    name: str
    title: str
    source: str
    label_columns: Sequence[str]
    metrics: Sequence[tuple]
    """``(metric key, column title, scale[, digits])``: e.g. ``("acc", "clean acc (%)", 100)`` (2 digits)."""
    cells: Sequence[Cell]
    notes: str = ""
    real_seeds: Sequence[int] = (0, 1, 2)
    datasets: Sequence[str] = ()
    """Fake datasets the smoke mode writes (keys of :data:`FAKE_WRITERS`)."""


@dataclass
class Context:
    """What a cell's run needs to know about the mode."""

    kit: str
    smoke: bool
    timing: bool
    workdir: Path
    data_root: Path | None
    device: str
    step_times: dict[str, float] = field(default_factory=dict)
    timing_target: str = ""
    """Timing mode: the timing key of the cell being timed; :func:`fit` stops the cell after timing that recipe
    (earlier stages, such as a pre-training, are trained for their 3 steps and timed on the way)."""
    cache: dict[Any, Any] = field(default_factory=dict)
    """Stages shared by several cells of one run (e.g. a pre-trained model per seed)."""

    @property
    def fake(self) -> bool:
        """Fake data (smoke and timing modes)."""
        return self.smoke or self.timing

    def data_dir(self, dataset: str) -> str | None:
        """The data folder of ``dataset``: the fake one in smoke/timing mode, ``--data-root/<dataset>`` or the
        library's default (``$DPROBUST_DATA/<dataset>``) in real mode."""
        if self.fake or self.data_root is not None:
            return str((self.data_root or self.workdir / "data") / dataset)
        return None

    def max_eval(self, real: int | None = None) -> int | None:
        """How many test examples an evaluation uses: 8 in smoke/timing mode, ``real`` (``None``: all) otherwise."""
        return 8 if self.fake else real


# ------------------------------------------------------------------------------------------------------- training
class TimingDone(Exception):
    """Raised by :func:`fit` in timing mode once the steps are timed: the cell's evaluation is not timed."""


class StepTimer(L.Callback):
    """Wall time of each training step (batch start to batch end, optimizer included)."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self._start = 0.0

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self._start = time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.times.append(time.perf_counter() - self._start)


def fit(
    context: Context,
    config: str | Path | Mapping[str, Any],
    seed: int,
    overrides: Sequence[str] = (),
    smoke_overrides: Sequence[str] = (),
    dataset: str | None = None,
    test: bool = True,
    timing_key: str = "",
    prepare: Callable[[L.LightningModule], None] | None = None,
    train_indices: Sequence[int] | None = None,
    batch_limited: bool = False,
    timing_batch: int = 0,
) -> FittedRecipe:
    """Fit a recipe exactly as ``dprobust fit`` would (:func:`build_recipe`), seeded (:func:`seeded_config`), quiet,
    without checkpoints, and test it.

    ``overrides`` apply in every mode (the paper's settings), ``smoke_overrides`` only in smoke mode (tiny model);
    in smoke and timing modes the data folder is the fake one of ``dataset`` and training stops after 2 (smoke) or 3
    (timing) steps. In timing mode the median time of the steps after the first is stored under ``timing_key``.
    ``prepare(module)`` runs after the module is built and before training (e.g. to load pre-trained weights).
    ``train_indices``: train on these examples of the data module's train split only (a membership-audit quarter).
    ``batch_limited``: limit smoke/timing runs by training batches, not optimizer steps (modules that step several
    optimizers per batch, such as the EHR generators).
    ``timing_batch``: in timing mode, the largest batch timed when not :data:`TIMING_BATCH` (a recipe whose step time
    is linear in the batch and too slow or too large to time at 64 examples).
    """
    path = Path(config) if isinstance(config, str | Path) else None
    seeded = seeded_config(path if path is not None else dict(config), seed)
    for key in ("logger", "callbacks"):  # replaced below (no logger, no checkpoints), whatever the recipe names
        (seeded.get("trainer") or {}).pop(key, None)
    runs = context.workdir / "runs"
    run_dir = runs / str(len(list(runs.glob("*"))) if runs.is_dir() else 0)
    args = [
        "--trainer.logger=false",
        f"--trainer.default_root_dir={run_dir}",
        "--trainer.enable_progress_bar=false",
        "--trainer.enable_model_summary=false",
        "--trainer.enable_checkpointing=false",
        "--trainer.callbacks=[]",
        f"--trainer.accelerator={'gpu' if context.device.startswith('cuda') else 'cpu'}",
        "--trainer.devices=1",
        *overrides,
    ]
    if dataset is not None and context.data_dir(dataset) is not None:
        args.append(f"--data.init_args.data_dir={context.data_dir(dataset)}")
    if context.fake:
        args += FAKE_DATA_ARGS.get(dataset or "", [])
    scale = 1.0
    if context.timing:  # the real recipe at a batch of at most TIMING_BATCH; per-step time scaled to the real batch
        batch = int(((seeded.get("data") or {}).get("init_args") or {}).get("batch_size") or TIMING_BATCH)
        cap = min(batch, timing_batch or TIMING_BATCH)
        scale = batch / cap
        args.append(f"--data.init_args.batch_size={cap}")
        model_args = (seeded.get("model") or {}).get("init_args") or {}
        if "batch_size" in model_args:  # StoBatch's own batches
            args.append(f"--model.init_args.batch_size={cap}")
        if model_args.get("pretrained"):  # same architecture, random weights (the hub is not reached)
            args.append("--model.init_args.pretrained=false")
    if context.fake:
        limit = 2 if context.smoke else 3
        args += [a.replace("max_steps=2", f"max_steps={limit}") for a in SMOKE_TRAINER]
        if batch_limited:
            args += ["--trainer.max_steps=-1", f"--trainer.limit_train_batches={limit}"]
        if context.smoke:
            args += list(smoke_overrides)
    with _quiet():
        cli = build_recipe(seeded, args)
        timer = StepTimer()
        cli.trainer.callbacks.append(timer)
        if prepare is not None:
            prepare(cli.model)
        if train_indices is not None:
            cli.datamodule.setup("fit")
            cli.datamodule.train_set = Subset(cli.datamodule.train_set, [int(i) for i in train_indices])
        cli.trainer.fit(cli.model, cli.datamodule)
        metrics = cli.trainer.test(cli.model, cli.datamodule, verbose=False)[0] if test else {}
    if context.timing:
        if timing_key and len(timer.times) > 1:
            context.step_times[timing_key] = scale * float(np.median(timer.times[1:]))
        if timing_key == context.timing_target:
            raise TimingDone(timing_key)
    return FittedRecipe(cli.trainer, cli.model, cli.datamodule, find_dp_callback(cli.trainer), metrics)


def datamodule_of(
    context: Context,
    config: str | Path | Mapping[str, Any],
    overrides: Sequence[str] = (),
    smoke_overrides: Sequence[str] = (),
    dataset: str | None = None,
):
    """The data module a :func:`fit` with the same arguments would train on, set up (nothing is trained)."""
    config = seeded_config(Path(config) if isinstance(config, str | Path) else dict(config), 0)
    for key in ("logger", "callbacks"):
        (config.get("trainer") or {}).pop(key, None)
    args = ["--trainer.logger=false", *overrides]
    if dataset is not None and context.data_dir(dataset) is not None:
        args.append(f"--data.init_args.data_dir={context.data_dir(dataset)}")
    if context.fake:
        args += FAKE_DATA_ARGS.get(dataset or "", [])
    if context.smoke:
        args += list(smoke_overrides)
    with _quiet():
        datamodule = build_recipe(
            seeded_config(Path(config) if isinstance(config, str | Path) else dict(config), 0), args
        ).datamodule
    datamodule.setup("fit")
    datamodule.setup("test")
    return datamodule


def epsilon_of(fitted: FittedRecipe) -> float:
    """The run's DP epsilon (``inf`` without DP)."""
    return float(fitted.privacy.epsilon()) if fitted.privacy is not None else math.inf


def attack_accuracies(
    module: torch.nn.Module,
    data: tuple[torch.Tensor, torch.Tensor],
    suite: Mapping[str, tuple[str, float, dict]],
    seed: int,
    device: str = "cpu",
) -> dict[str, float]:
    """Clean accuracy (``"clean"``) and accuracy under each ``label: (attack name, eps, kwargs)`` of ``suite``
    (:func:`lightning_dprobust.robustness.attacks.robust_accuracy`: each attack on every example, seeded)."""
    from lightning_dprobust.robustness.attacks import build_attack, robust_accuracy

    module = module.eval().to(device)
    attacks = {label: build_attack(name, module, eps, **kwargs) for label, (name, eps, kwargs) in suite.items()}
    return robust_accuracy(module, data, attacks, seed=seed, device=device)


def test_tensors(datamodule, limit: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    """The test split (its first ``limit`` examples) as two tensors."""
    dataset = datamodule.test_set if datamodule.test_set is not None else None
    if dataset is None:
        datamodule.setup("test")
        dataset = datamodule.test_set
    n = len(dataset) if limit is None else min(limit, len(dataset))
    xs, ys = zip(*(dataset[i] for i in range(n)), strict=True)
    return torch.stack(list(xs)), torch.as_tensor([int(y) for y in ys])


def config_path(method: str, dataset: str) -> Path:
    """The shipped recipe ``configs/<method>/<dataset>.yaml``, or a kit's ``configs/papers/<method>/<dataset>.yaml``."""
    for root in (CONFIG_DIR, PAPER_CONFIGS):
        path = root / method / f"{dataset}.yaml"
        if path.is_file():
            return path
    raise FileNotFoundError(f"no recipe {method}/{dataset}.yaml under {CONFIG_DIR} or {PAPER_CONFIGS}")


def load_config(path: str | Path) -> dict[str, Any]:
    return yaml.safe_load(Path(path).read_text())


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    logger = logging.getLogger("lightning.pytorch")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        logger.setLevel(level)


# ------------------------------------------------------------------------------------------------------ fake data
def _idx(path: Path, array: np.ndarray) -> None:
    magic = {1: b"\x00\x00\x08\x01", 3: b"\x00\x00\x08\x03"}[array.ndim]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(magic + struct.pack(f">{array.ndim}I", *array.shape) + array.astype(np.uint8).tobytes())


def _labels(n: int, classes: int) -> np.ndarray:
    return (np.arange(n) % classes).astype(np.uint8)


def write_fake_mnist(root: Path, folder: str = "MNIST", n_train: int = 60, n_test: int = 20) -> None:
    """Uncompressed idx files under ``root/<folder>/raw`` (torchvision's layout), class-coloured random images."""
    rng = np.random.default_rng(0)
    for split, n in (("train", n_train), ("t10k", n_test)):
        labels = _labels(n, 10)
        images = rng.integers(0, 120, (n, 28, 28)) + 12 * labels[:, None, None]
        _idx(root / folder / "raw" / f"{split}-images-idx3-ubyte", images.astype(np.uint8))
        _idx(root / folder / "raw" / f"{split}-labels-idx1-ubyte", labels)


def write_fake_cifar(root: Path, per_batch: int = 12, n_test: int = 20, classes: int = 10) -> None:
    """``cifar-10-batches-py`` (five training pickles, a test pickle, ``batches.meta``) or, with ``classes=100``,
    ``cifar-100-python`` (``train``, ``test``, ``meta``)."""
    rng = np.random.default_rng(classes)
    if classes == 10:
        folder = root / "cifar-10-batches-py"
        folder.mkdir(parents=True, exist_ok=True)
        names = [*(f"data_batch_{k}" for k in range(1, 6)), "test_batch"]
        for name in names:
            n = n_test if name == "test_batch" else per_batch
            labels = [int(i % 10) for i in range(n)]
            data = rng.integers(0, 256, (n, 3072), dtype=np.uint8)
            (folder / name).write_bytes(pickle.dumps({"batch_label": name, "labels": labels, "data": data}, protocol=2))
        (folder / "batches.meta").write_bytes(pickle.dumps({"label_names": [f"c{i}" for i in range(10)]}, protocol=2))
        return
    folder = root / "cifar-100-python"
    folder.mkdir(parents=True, exist_ok=True)
    for name, n in (("train", 5 * per_batch), ("test", n_test)):
        fine = [int(i % 100) for i in range(n)]
        batch = {
            "filenames": [f"{i}.png" for i in range(n)],
            "fine_labels": fine,
            "coarse_labels": [f // 5 for f in fine],
            "data": rng.integers(0, 256, (n, 3072), dtype=np.uint8),
        }
        (folder / name).write_bytes(pickle.dumps(batch, protocol=2))
    meta = {"fine_label_names": [f"f{i}" for i in range(100)], "coarse_label_names": [f"c{i}" for i in range(20)]}
    (folder / "meta").write_bytes(pickle.dumps(meta, protocol=2))


def write_fake_idc(root: Path, patients: int = 12, per_class: int = 3) -> None:
    """``<patient>/<label>/<patient>_idx5_x.._y.._class<label>.png`` 50x50 patches, as the IDC release."""
    from PIL import Image

    rng = np.random.default_rng(0)
    for p in range(patients):
        for label in (0, 1):
            for i in range(per_class):
                colour = rng.integers(0, 120, 3) + 100 * label
                image = np.broadcast_to(colour.astype(np.uint8), (50, 50, 3)).copy()
                path = root / f"{9000 + p}" / str(label) / f"{9000 + p}_idx5_x{50 * i}_y0_class{label}.png"
                path.parent.mkdir(parents=True, exist_ok=True)
                Image.fromarray(image).save(path)


MIMIC_EDSTAYS = "subject_id,hadm_id,stay_id,intime,outtime,gender,race,arrival_transport,disposition"
MIMIC_TRIAGE = "subject_id,stay_id,temperature,heartrate,resprate,o2sat,sbp,dbp,pain,acuity,chiefcomplaint"
MIMIC_VITALSIGN = "subject_id,stay_id,charttime,temperature,heartrate,resprate,o2sat,sbp,dbp,rhythm,pain"
MIMIC_PATIENTS = "subject_id,gender,anchor_age,anchor_year,anchor_year_group,dod"


def write_fake_mimic(root: Path, stays: int = 48, steps: int = 6) -> None:
    """``edstays.csv``, ``triage.csv``, ``vitalsign.csv`` and MIMIC-IV's ``patients.csv`` with the official column
    names (PhysioNet MIMIC-IV-ED 2.2), ``stays`` random ED stays of ``steps`` vital-sign rows each."""
    rng = np.random.default_rng(0)
    root.mkdir(parents=True, exist_ok=True)
    races = ["WHITE", "BLACK/AFRICAN AMERICAN", "ASIAN - CHINESE", "HISPANIC/LATINO - DOMINICAN"]
    edstays, triage, vitals, patients = [], [], [], []
    for k in range(stays):
        subject, stay, gender = 10_000_000 + k, 30_000_000 + k, "FM"[k % 2]
        day = 1 + k % 27
        edstays.append(
            f"{subject},,{stay},2150-03-{day:02d} 08:00:00,2150-03-{day:02d} 20:00:00,{gender},"
            f"{races[k % 4]},WALK IN,HOME"
        )
        triage.append(f"{subject},{stay},98.{k % 10},{70 + k % 30},16,97,{110 + k % 40},70,3,3,Pain")
        patients.append(f"{subject},{gender},{20 + (3 * k) % 60},2150,2014 - 2016,")
        for t in range(steps):
            v = rng.normal(0, 1, 6)
            vitals.append(
                f"{subject},{stay},2150-03-{day:02d} {9 + t:02d}:{int(rng.integers(0, 59)):02d}:00,"
                f"{98.2 + 0.5 * v[0]:.1f},{80 + 10 * v[1]:.0f},{16 + 2 * v[2]:.0f},{97 + v[3]:.0f},"
                f"{120 + 12 * v[4]:.0f},{75 + 8 * v[5]:.0f},,{int(rng.integers(0, 10))}"
            )
    for name, header, rows in (
        ("edstays.csv", MIMIC_EDSTAYS, edstays),
        ("triage.csv", MIMIC_TRIAGE, triage),
        ("vitalsign.csv", MIMIC_VITALSIGN, vitals),
        ("patients.csv", MIMIC_PATIENTS, patients),
    ):
        (root / name).write_text("\n".join([header, *rows]) + "\n")


FAKE_WRITERS: dict[str, Callable[[Path, int], None]] = {
    "mnist": lambda root, n: write_fake_mnist(root, "MNIST", n_train=n),
    "fashion_mnist": lambda root, n: write_fake_mnist(root, "FashionMNIST", n_train=n),
    "cifar10": lambda root, n: write_fake_cifar(root, per_batch=n // 5, classes=10),
    "cifar100": lambda root, n: write_fake_cifar(root, per_batch=n // 5, classes=100),
    "idc": lambda root, n: write_fake_idc(root, patients=max(12, n // 50), per_class=3 if n <= 100 else 25),
    "mimic_iv_ed": lambda root, n: write_fake_mimic(root, stays=max(48, n // 2)),
}
"""Fake dataset writers, by the data folder name each data module reads (``<root>/<name>``), and training-set size."""

FAKE_DATA_ARGS = {"idc": ["--data.init_args.train_size=0.5", "--data.init_args.test_size=0.3"]}
"""Data-module arguments the fake sets need (the IDC module checks the official patch count unless given fractions)."""

SMOKE_SIZE, TIMING_SIZE, TIMING_BATCH = 60, 1000, 64
"""Fake training-set sizes (smoke mode, timing mode) and the largest batch timed: a recipe's per-step time at a larger
batch is the time at ``TIMING_BATCH`` scaled linearly (an approximation: small batches use the hardware less well, so
this tends to overstate the per-step time)."""


@contextlib.contextmanager
def fake_md5s(root: Path) -> Iterator[None]:
    """Point torchvision's published CIFAR MD5 sums at the fake files for the duration (the data modules check
    every CIFAR file against them); MNIST's uncompressed idx files have no MD5 check."""
    from torchvision.datasets import CIFAR10, CIFAR100

    saved = {cls: (cls.train_list, cls.test_list, cls.meta) for cls in (CIFAR10, CIFAR100)}

    def md5(path: Path) -> str:
        import hashlib

        return hashlib.md5(path.read_bytes()).hexdigest()

    try:
        for cls, name in ((CIFAR10, "cifar10"), (CIFAR100, "cifar100")):
            folder = root / name / cls.base_folder
            if folder.is_dir():
                cls.train_list = [[n, md5(folder / n)] for n, _ in cls.train_list]
                cls.test_list = [[n, md5(folder / n)] for n, _ in cls.test_list]
                cls.meta = {**cls.meta, "md5": md5(folder / cls.meta["filename"])}
        yield
    finally:
        for cls, (train, test, meta) in saved.items():
            cls.train_list, cls.test_list, cls.meta = train, test, meta


# --------------------------------------------------------------------------------------------------------- output
def slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-")


def run_kit(
    kit: Kit,
    *,
    smoke: bool = False,
    out: str | Path | None = None,
    seeds: Sequence[int] | None = None,
    only: Sequence[str] = (),
    data_root: str | Path | None = None,
    device: str = "cpu",
) -> Path:
    """Run every cell of ``kit`` (or those whose key contains one of ``only``) and write the result files and the
    markdown table; returns the table's path."""
    seeds = list(seeds if seeds is not None else ((0,) if smoke else kit.real_seeds))
    target = Path(out) if out is not None else RESULTS_DIR / "papers" / kit.name
    cells = [cell for cell in kit.cells if not only or any(part in cell.key for part in only)]
    measured: dict[str, dict[int, dict[str, float]]] = {}
    with tempfile.TemporaryDirectory(prefix=f"kit-{kit.name}-") as scratch:
        workdir = Path(scratch)
        context = Context(kit.name, smoke, False, workdir, Path(data_root) if data_root else None, device)
        if smoke:
            for dataset in kit.datasets:
                FAKE_WRITERS[dataset](workdir / "data" / dataset, SMOKE_SIZE)
        with fake_md5s(workdir / "data") if smoke else contextlib.nullcontext():
            for cell in cells:
                if cell.skip or cell.run is None:
                    continue
                measured[cell.key] = {}
                for seed in seeds:
                    start = time.perf_counter()
                    metrics = dict(cell.run(context, seed))
                    metrics["seconds"] = time.perf_counter() - start
                    measured[cell.key][seed] = metrics
                    print(json.dumps({"cell": cell.key, "seed": seed, **metrics}), flush=True)
                _write_cell(kit, cell, measured[cell.key], seeds, target, smoke, device)
    return _write_table(kit, cells, measured, seeds, target, smoke, device)


def _cell_value(runs: Mapping[int, Mapping[str, float]], key: str, scale: float, digits: int = 2) -> str:
    """``mean +- std`` of a metric over the seeds (:func:`seeds.spread_cell`); ``-`` when no run has it (``nan``)."""
    values = [run[key] for run in runs.values() if key in run and not math.isnan(run[key])]
    if not values:
        return "-"
    return spread_cell(values, scale, digits)


def _metrics(kit: Kit) -> list[tuple[str, str, float, int]]:
    """``(key, title, scale, digits)`` of each metric (digits default to 2)."""
    return [(*metric, 2) if len(metric) == 3 else tuple(metric) for metric in kit.metrics]


def _mode(smoke: bool) -> str:
    return "SMOKE (fake data, tiny models, 2 steps: the numbers mean nothing)" if smoke else "real"


def _write_cell(kit: Kit, cell: Cell, runs, seeds, target: Path, smoke: bool, device: str) -> None:
    rows = [
        [title, _cell_value(runs, key, scale, d), cell.paper.get(key, "-")] for key, title, scale, d in _metrics(kit)
    ]
    rows.append(["seconds (this run)", _cell_value(runs, "seconds", 1.0), "-"])
    write_result(
        f"{kit.name}__{slug(cell.key)}",
        title=f"{kit.title}: {', '.join(cell.labels)}",
        columns=["metric", "measured", f"paper ({kit.source})"],
        rows=rows,
        seeds=seeds,
        notes=f"mode: {_mode(smoke)}. {cell.note}".strip(),
        raw={"labels": list(cell.labels), "runs": {str(seed): run for seed, run in runs.items()}},
        device=device,
        directory=target,
    )


def table_columns(kit: Kit) -> list[str]:
    return [*kit.label_columns, *(part for _, title, *_ in kit.metrics for part in (title, f"{title} paper"))]


def table_rows(kit: Kit, cells: Sequence[Cell], measured) -> list[list[str]]:
    rows = []
    for cell in cells:
        runs = measured.get(cell.key, {})
        values = []
        for index, (key, _, scale, digits) in enumerate(_metrics(kit)):
            here = ("-" if index else f"not run: {cell.skip}") if cell.skip else _cell_value(runs, key, scale, digits)
            values += [here, cell.paper.get(key, "-")]
        rows.append([*cell.labels, *values])
    return rows


def _write_table(kit: Kit, cells, measured, seeds, target: Path, smoke: bool, device: str) -> Path:
    columns, rows = table_columns(kit), table_rows(kit, cells, measured)
    notes = "; ".join(f"{', '.join(c.labels)}: {c.note}" for c in cells if c.note)
    spread = f"mean +- sample std over seeds {seeds}" if len(seeds) > 1 else f"single run (seed {seeds[0]})"
    header = (
        f"# {kit.title}\n\nMode: {_mode(smoke)}. Measured cells: {spread}. Columns marked `paper` are transcribed "
        f"from {kit.source}.\n\n"
    )
    text = header + markdown_table(columns, rows) + "\n\n" + (f"Cell notes: {notes}\n\n" if notes else "")
    text += kit.notes.strip() + "\n"
    target.mkdir(parents=True, exist_ok=True)
    path = target / f"{kit.name}.md"
    path.write_text(text)
    write_result(
        kit.name,
        title=kit.title,
        columns=columns,
        rows=rows,
        seeds=seeds,
        notes=f"mode: {_mode(smoke)}; paper numbers from {kit.source}. {kit.notes.strip()}",
        raw={"cells": [c.key for c in cells]},
        device=device,
        directory=target,
    )
    print(text, flush=True)
    return path


# ------------------------------------------------------------------------------------------------------- estimate
def estimate_rows(
    kit: Kit, speedup: float = GPU_SPEEDUP, seeds: int | None = None, only: Sequence[str] = ()
) -> tuple[list[list[str]], float]:
    """Time each distinct real-mode recipe of the grid for 3 steps (median of steps 2-3) on fake data of the real
    image shape, at a batch of at most :data:`TIMING_BATCH` scaled linearly to the recipe's, on this machine's CPU
    with one thread; return one row per cell (labels, real steps, CPU seconds per step, ``steps x seconds per step /
    speedup`` in GPU hours) and the total GPU hours times the number of seeds. An **estimate**: evaluation (attacks,
    certification, synthesis) is not timed, and the GPU speed-up is assumed (:data:`GPU_SPEEDUP`), not measured."""
    seeds = len(kit.real_seeds) if seeds is None else seeds
    rows, total = [], 0.0
    with tempfile.TemporaryDirectory(prefix=f"kit-{kit.name}-estimate-") as scratch:
        workdir = Path(scratch)
        for dataset in kit.datasets:
            FAKE_WRITERS[dataset](workdir / "data" / dataset, TIMING_SIZE)
        context = Context(kit.name, False, True, workdir, None, "cpu")
        with fake_md5s(workdir / "data"):
            for cell in kit.cells:
                if cell.skip or cell.run is None or not cell.real_steps:
                    continue
                if only and not any(part in cell.key for part in only):
                    continue
                if cell.timing_key not in context.step_times:
                    context.timing_target = cell.timing_key
                    try:
                        cell.run(context, 0)
                    except TimingDone:
                        pass
                    except Exception as err:  # noqa: BLE001 - an estimate reports what it could not time
                        rows.append([", ".join(cell.labels), f"not timed: {type(err).__name__}: {err}", "", ""])
                        continue
                per_step = context.step_times.get(cell.timing_key, float("nan"))
                gpu_h = cell.real_steps * per_step / speedup / 3600
                total += gpu_h if math.isfinite(gpu_h) else 0.0
                rows.append([", ".join(cell.labels), str(cell.real_steps), f"{per_step:.3f}", f"{gpu_h:.2f}"])
    return rows, total * seeds


ESTIMATE_COLUMNS = ["cell", "real steps", "CPU s/step (measured)", "GPU hours (estimate)"]


def estimate(kit: Kit, speedup: float = GPU_SPEEDUP, seeds: int | None = None, only: Sequence[str] = ()) -> str:
    """:func:`estimate_rows` as a markdown table and a total line."""
    seeds = len(kit.real_seeds) if seeds is None else seeds
    rows, total = estimate_rows(kit, speedup, seeds, only)
    return (
        markdown_table(ESTIMATE_COLUMNS, rows) + f"\n\nTotal: about {total:.1f} GPU hours for {seeds} seed(s) "
        f"(ESTIMATE: CPU step time / {speedup:g} assumed GPU speed-up, training only)\n"
    )


def write_estimate(kit: Kit, directory: str | Path | None = None, speedup: float = GPU_SPEEDUP) -> Path:
    """The whole grid's :func:`estimate_rows` as the result file ``paper_kit_gpu_estimate_<kit>``, its total the
    last row."""
    seeds = len(kit.real_seeds)
    rows, total = estimate_rows(kit, speedup, seeds)
    return write_result(
        f"paper_kit_gpu_estimate_{kit.name}",
        title=f"{kit.title}: estimated GPU time of the real run",
        columns=ESTIMATE_COLUMNS,
        rows=[*rows, [f"total, {seeds} seeds", "", "", f"{total:.1f}"]],
        seeds=kit.real_seeds,
        notes=f"ESTIMATE, not a measurement: each distinct real recipe timed for 3 steps (median of steps 2-3) on "
        f"this CPU with one thread, on fake data of the real shape, then divided by an assumed GPU speed-up of "
        f"{speedup:g}; training only (evaluation not timed)",
        directory=directory,
    )


# ----------------------------------------------------------------------------------------------------------- main
def main(kits: Kit | Sequence[Kit], argv: Sequence[str] | None = None, doc: str = "") -> list[Path]:
    """The command line of a kit module: one kit, or several (one table each, e.g. the thesis's three chapters)."""
    kits = [kits] if isinstance(kits, Kit) else list(kits)
    parser = argparse.ArgumentParser(
        description=doc or kits[0].title, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--smoke", action="store_true", help="whole grid on fake data, tiny models, 2 steps/cell")
    parser.add_argument(
        "--estimate",
        action="store_true",
        help="time the real recipes; print the GPU estimate (without --cells: also its result file)",
    )
    parser.add_argument(
        "--out",
        help="folder for the result files and table (default: results/papers/<kit>/; smoke: a temporary folder)",
    )
    parser.add_argument("--seeds", type=int, nargs="+", help=f"default: {list(kits[0].real_seeds)} (smoke: 0)")
    parser.add_argument("--cells", nargs="+", default=(), help="only the cells whose key contains one of these")
    parser.add_argument("--data-root", help="folder holding <dataset>/ folders (default: $DPROBUST_DATA)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--list", action="store_true", help="print the grid's cell keys and exit")
    parser.add_argument("--kit", choices=[kit.name for kit in kits], help="only this one of the module's kits")
    args = parser.parse_args(argv)
    kits = [kit for kit in kits if args.kit in (None, kit.name)]
    if args.list:
        for kit in kits:
            for cell in kit.cells:
                print(kit.name, "|", cell.key, "|", ", ".join(cell.labels), "|", cell.skip or "run")
        return []
    quiet_training()
    if args.estimate:
        torch.set_num_threads(1)
        for kit in kits:
            if not args.cells:
                print(f"## {kit.name}: {write_estimate(kit, args.out)}")
            elif any(part in cell.key for cell in kit.cells for part in args.cells):
                print(f"## {kit.name}\n\n{estimate(kit, only=args.cells)}")
        return []
    base = Path(tempfile.mkdtemp(prefix="kit-smoke-")) if args.smoke and args.out is None else args.out
    tables = []
    for kit in kits:
        out = None if base is None else Path(base) / kit.name if len(kits) > 1 else Path(base)
        if args.cells and not any(part in cell.key for cell in kit.cells for part in args.cells):
            continue
        tables.append(run_kit(kit, smoke=args.smoke, out=out, seeds=args.seeds, only=args.cells,
                              data_root=args.data_root, device="cpu" if args.smoke else args.device))  # fmt: skip
    return tables
