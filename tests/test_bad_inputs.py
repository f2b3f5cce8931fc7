"""The bad-input catalogue of ``docs/bad_inputs.md``: every bad config value, data file, checkpoint and flag makes
``dprobust`` exit with status 2 and one clear message, without a traceback, and without touching a run's folder."""

from __future__ import annotations

import copy
import hashlib
import os
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
import yaml
from torch.utils.data import DataLoader, TensorDataset, WeightedRandomSampler

from lightning_dprobust import zoo
from lightning_dprobust.cli import main
from lightning_dprobust.data import DigitsDataModule
from lightning_dprobust.recipes import composed_config
from tests.data.fake_data import truncate, write_cifar, write_idc, write_idx, write_mnist

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = composed_config(ROOT / "configs" / "dpsgd" / "digits.yaml")
LAST = Path("runs") / "dpsgd-digits" / "checkpoints" / "last.ckpt"

Edit = Callable[[dict, Path], None]
Build = Callable[[Path, Path], list[str]]  # (fresh folder, folder of a finished run) -> dprobust arguments


# ---------------------------------------------------------------------------------------- bad data modules
class CorruptedDigits(DigitsDataModule):
    """Digits whose training tensors pass through ``corrupt`` (a bug in a user's dataset or transform)."""

    @staticmethod
    def corrupt(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x, y

    def setup(self, stage: str | None = None) -> None:
        super().setup(stage)
        self.train_set = TensorDataset(*self.corrupt(*(t.clone() for t in self.train_set.tensors)))


class NaNPixelDigits(CorruptedDigits):
    @staticmethod
    def corrupt(x, y):
        x[::10, 0, 3, 3] = float("nan")
        return x, y


class OneBasedLabelDigits(CorruptedDigits):
    @staticmethod
    def corrupt(x, y):
        return x, y + 1


class PaddedDigits(CorruptedDigits):
    @staticmethod
    def corrupt(x, y):
        return F.pad(x, (1, 1, 1, 1)), y


class NormalizedDigits(CorruptedDigits):
    @staticmethod
    def corrupt(x, y):
        return (x - 0.3063) / 0.3794, y


class FiveDigits(CorruptedDigits):
    @staticmethod
    def corrupt(x, y):
        return x[:5], y[:5]


class WeightedDigits(DigitsDataModule):
    def train_dataloader(self) -> DataLoader:
        weights = torch.ones(len(self.train_set))
        return DataLoader(self.train_set, self.batch_size, sampler=WeightedRandomSampler(weights, len(weights)))


# ---------------------------------------------------------------------------------------- argument builders
def shortened(edit: Edit | None, folder: Path) -> Path:
    """The shipped DP-SGD digits config, two steps, no logger; ``edit`` applied; written into ``folder``."""
    config = copy.deepcopy(SHIPPED)
    config["trainer"].update(
        logger=False,
        max_steps=2,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
        num_sanity_val_steps=0,
    )
    if edit is not None:
        edit(config, folder)
    path = folder / "bad.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def fit(edit: Edit | None = None, *extra: str, resume: Callable[[Path, Path], Path] | None = None) -> Build:
    def build(folder: Path, finished: Path) -> list[str]:
        args = ["fit", "--config", str(shortened(edit, folder)), *extra]
        return args + (["--ckpt_path", str(resume(folder, finished))] if resume else [])

    return build


def edits(*steps: Edit) -> Edit:
    def edit(config: dict, folder: Path) -> None:
        for step in steps:
            step(config, folder)

    return edit


def dp(**values) -> Edit:
    return lambda config, folder: config["dp"].update(values)


def section(name: str, **values) -> Edit:
    return lambda config, folder: config[name]["init_args"].update(values)


def data(class_path: str, prepare: Callable[[Path], object] | None = None, **init_args) -> Edit:
    def edit(config: dict, folder: Path) -> None:
        if prepare is not None:
            prepare(folder / "data")
        config["data"] = {
            "class_path": class_path,
            "init_args": {"batch_size": 8, "data_dir": str(folder / "data"), **init_args},
        }

    return edit


def evaluate(command: str, checkpoint: Callable[[Path, Path], Path | str], *extra: str) -> Build:
    return lambda folder, finished: [command, "--ckpt_path", str(checkpoint(folder, finished)), *extra]


# ---------------------------------------------------------------------------------------- bad files
def mnist_with(damage: Callable[[Path], object]) -> Callable[[Path], None]:
    def prepare(root: Path) -> None:
        write_mnist(root)
        damage(root / "MNIST" / "raw")

    return prepare


def good(folder: Path, finished: Path) -> Path:
    return finished / LAST


def foreign(folder: Path, finished: Path) -> Path:
    """A checkpoint that was not written by a lightning-dprobust method."""
    torch.save({"state_dict": {}}, folder / "foreign.ckpt")
    return folder / "foreign.ckpt"


def damaged(damage: Callable[[Path], object]) -> Callable[[Path, Path], Path]:
    def make(folder: Path, finished: Path) -> Path:
        path = folder / "damaged.ckpt"
        shutil.copy(finished / LAST, path)
        damage(path)
        return path

    return make


class Payload:
    """An object whose unpickling would create a file: proof that a refused checkpoint ran nothing."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


def with_code(path: Path) -> None:
    checkpoint = torch.load(path, weights_only=True)
    checkpoint["hyper_parameters"]["model_kwargs"] = Payload(path.with_name("pwned"))
    torch.save(checkpoint, path)


def resized(path: Path) -> None:
    checkpoint = torch.load(path, weights_only=True)
    checkpoint["hyper_parameters"]["model_kwargs"] = {"hidden": 32}
    torch.save(checkpoint, path)


def nan_weight(path: Path) -> None:
    checkpoint = torch.load(path, weights_only=True)
    next(value for key, value in checkpoint["state_dict"].items() if key.endswith("weight"))[0, 0] = float("nan")
    torch.save(checkpoint, path)


def without_hyper_parameters(path: Path) -> None:
    checkpoint = torch.load(path, weights_only=True)
    del checkpoint["hyper_parameters"]
    torch.save(checkpoint, path)


def a_file(folder: Path, finished: Path) -> Path:
    (folder / "report.txt").write_text("not a folder")
    return folder / "report.txt"


def on_mnist(command: str, *extra: str) -> Build:
    """``command`` on the digits checkpoint with ``--data mnist`` (fake MNIST files under ``$DPROBUST_DATA``)."""

    def build(folder: Path, finished: Path) -> list[str]:
        write_mnist(folder / "data" / "mnist")
        return [command, "--ckpt_path", str(finished / LAST), "--data", "mnist", "--no-wandb", *extra]

    return build


def in_used_folder(folder: Path, finished: Path) -> list[str]:
    shutil.copytree(finished / "runs", folder / "runs")
    return ["fit", "--config", str(shortened(None, folder))]


def dp_in_trainer_callbacks(config: dict, folder: Path) -> None:
    config["trainer"]["callbacks"].append({"class_path": "lightning_dprobust.callbacks.DPCallback",
                                           "init_args": config.pop("dp")})  # fmt: skip


def folder_for_labels(raw: Path) -> None:
    (raw / "train-labels-idx1-ubyte").unlink()
    (raw / "train-labels-idx1-ubyte").mkdir()


def tampered_zoo_cache(folder: Path, finished: Path) -> str:
    name = "mlp_tanh.dpsgd_digits_eps3"
    cached = folder / "home" / "zoo" / zoo.info(name).file
    cached.parent.mkdir(parents=True)
    weights = bytearray((zoo.ZOO_DIR / zoo.info(name).url).read_bytes())
    weights[-1] ^= 0xFF
    cached.write_bytes(weights)
    return name


def duplicated_key(folder: Path, finished: Path) -> list[str]:
    path = shortened(None, folder)
    path.write_text("seed_everything: 1\n" + path.read_text())  # the shipped config sets it too
    return ["fit", "--config", str(path)]


def evaluation_config_with_duplicate(folder: Path, finished: Path) -> list[str]:
    (folder / "flags.yaml").write_text("sigma: 0.25\nsigma: 0.5\n")
    return ["certify", "--ckpt_path", str(finished / LAST), "--config", str(folder / "flags.yaml")]


def other_method(config: dict, folder: Path) -> None:
    config["model"]["class_path"] = "lightning_dprobust.methods.DPCert"
    config["trainer"]["max_steps"] = 8


def last_with_other_lr(folder: Path, finished: Path) -> list[str]:
    shutil.copytree(finished / "runs", folder / "runs")
    config = shortened(lambda c, f: c["model"]["init_args"].update(lr=0.1) or c["trainer"].update(max_steps=8), folder)
    return ["fit", "--config", str(config), "--ckpt_path", "last"]


def with_foreign_hyperparameter(path: Path) -> None:
    checkpoint = torch.load(path, weights_only=True)
    checkpoint["hyper_parameters"]["bogus"] = 3
    torch.save(checkpoint, path)


IGAMT_RECIPE = composed_config(ROOT / "configs" / "igamt" / "synthetic.yaml")


def ehr_csv_with(value: str) -> Build:
    """``dprobust fit`` of the IGAMT recipe, two steps, on a long-format EHR CSV whose one measurement is ``value``."""

    def build(folder: Path, finished: Path) -> list[str]:
        rows = [f"p{i},{t},hr,{value if (i, t) == (3, 1) else 70 + t},{30 + i}" for i in range(40) for t in range(3)]
        (folder / "ehr.csv").write_text("patient,time,feature,value,age\n" + "\n".join(rows) + "\n")
        config = copy.deepcopy(IGAMT_RECIPE)
        config["trainer"].update(logger=False, max_steps=2, enable_progress_bar=False, enable_model_summary=False)
        config["model"]["init_args"].update(num_features=2, static_continuous=1, static_groups=[], max_steps=3)
        ranges = {"time_increment": [0, 2], "hr": [0, 200], "age": [0, 100]}
        config["data"]["init_args"] = {"source": "csv", "csv_path": str(folder / "ehr.csv"), "scaling": "public",
                                       "num_steps": 3, "batch_size": 8, "ranges": ranges}  # fmt: skip
        (folder / "ehr.yaml").write_text(yaml.safe_dump(config))
        return ["fit", "--config", str(folder / "ehr.yaml")]

    return build


def recipe(path: str, **model_args) -> Build:
    """``dprobust fit`` of the shipped recipe ``configs/<path>``, two steps, no logger, ``model_args`` over its
    model's."""

    def build(folder: Path, finished: Path) -> list[str]:
        config = composed_config(ROOT / "configs" / path)
        config["trainer"].update(logger=False, max_steps=2, enable_progress_bar=False, enable_model_summary=False)
        config["model"]["init_args"].update(model_args)
        (folder / "recipe.yaml").write_text(yaml.safe_dump(config))
        return ["fit", "--config", str(folder / "recipe.yaml")]

    return build


MNIST5K_CLASSIFIER = "cnn_tanh.erm_mnist5k"  # 1x28x28 inputs, where the digits recipes have 1x8x8


def truncated_release(folder: Path, finished: Path) -> list[str]:
    """``dprobust synthesize`` of the zoo's IGAMT release saved as a file, then cut in half."""
    zoo.load("igamt.dp_synthetic_ehr_s10").save(folder / "release.pt")
    truncate(folder / "release.pt")
    return ["synthesize", "--ckpt_path", str(folder / "release.pt"), "--n", "2", "--out", str(folder / "s.csv")]


DENOISER = "dncnn_gn.transdenoiser_digits_eps1_s025"


# ---------------------------------------------------------------------------------------- the catalogue
@dataclass(frozen=True)
class Bad:
    """One catalogue entry: ``phrase`` (a regex) must appear in the one ``dprobust: error:`` line, or, for
    ``usage=True`` (argument-parser errors, printed after the usage text), anywhere in stderr."""

    id: str
    build: Build
    phrase: str
    usage: bool = False


MNIST, HERE = "lightning_dprobust.data.MNISTDataModule", "tests.test_bad_inputs"
NO_NOISE = {"target_epsilon": None}


def digits_via(name: str) -> Edit:
    return data(f"{HERE}.{name}", data_dir=None, batch_size=128)


def cut_train_images(raw: Path) -> None:
    truncate(raw / "train-images-idx3-ubyte")


def small_test_images(raw: Path) -> None:
    write_idx(raw / "t10k-images-idx3-ubyte", np.zeros((10, 27, 27), np.uint8))


def negatives_only(root: Path) -> None:
    """IDC patient folders in the official layout, each without its ``1/`` (IDC-positive) folder."""
    write_idc(root, {str(patient): (4, 0) for patient in range(8)})


def bad_test_labels(raw: Path) -> None:
    write_idx(raw / "t10k-labels-idx1-ubyte", np.full(10, 12, np.uint8))


def accumulation_scheduler(config: dict, folder: Path) -> None:
    scheduler = {"class_path": "lightning.pytorch.callbacks.GradientAccumulationScheduler"}
    config["trainer"]["callbacks"].append(scheduler | {"init_args": {"scheduling": {0: 2}}})


def without_dp_ledger(path: Path) -> None:
    checkpoint = torch.load(path, weights_only=True)
    del checkpoint["callbacks"]["DPCallback"]
    torch.save(checkpoint, path)


def with_tiny_noise(path: Path) -> None:
    checkpoint = torch.load(path, weights_only=True)
    state = checkpoint["callbacks"]["DPCallback"]
    state["noise_multiplier"] = 1e-4
    state["ledger"]["history"] = [[1e-4, rate, steps] for _, rate, steps in state["ledger"]["history"]]
    torch.save(checkpoint, path)


def more_steps(config: dict, folder: Path) -> None:
    config["trainer"]["max_steps"] = 8  # past the finished run's checkpoint, so that training resumes


def residual(**values) -> Edit:
    """The digits recipe with ResidualPerturbation (no DPCallback) and ``values`` as its arguments."""

    def edit(config: dict, folder: Path) -> None:
        config["trainer"]["callbacks"] = []
        config["model"] = {"class_path": "lightning_dprobust.methods.ResidualPerturbation", "init_args": values}

    return edit


def unknown_method(config: dict, folder: Path) -> None:
    config["model"]["class_path"] = "lightning_dprobust.methods.NoSuchMethod"


def dpadv_with_autoattack(config: dict, folder: Path) -> None:
    config["model"]["class_path"] = "lightning_dprobust.methods.DPAdv"
    config["model"]["init_args"]["attack"] = "AutoAttack"


CATALOGUE = [
    # privacy settings
    Bad("noise-negative", fit(dp(**NO_NOISE, noise_multiplier=-1.0)), r"noise_multiplier=-1.0\) must be a finite"),
    Bad("noise-nan", fit(dp(**NO_NOISE, noise_multiplier=float("nan"))), r"noise_multiplier=nan\) must be a finite"),
    Bad("noise-infinite", fit(dp(**NO_NOISE, noise_multiplier=float("inf"))), r"noise_multiplier=inf\) must be a"),
    Bad("clip-zero", fit(dp(max_grad_norm=0.0)), r"max_grad_norm=0.0\) must be a finite number > 0"),
    Bad("clip-negative", fit(dp(max_grad_norm=-1.0)), r"max_grad_norm=-1.0\) must be a finite number > 0"),
    Bad("clip-nan", fit(dp(max_grad_norm=float("nan"))), r"max_grad_norm=nan\) must be a finite number > 0"),
    Bad("delta-at-least-1-over-n", fit(dp(delta=0.01)), r"delta=0.01\) is >= 1/n = 0.000773.*well below 1/n"),
    Bad("delta-one", fit(dp(delta=1.0)), r"delta=1.0\) must be < 1"),
    Bad("sample-rate-above-1", fit(dp(sample_rate=1.5)), r"sample_rate=1.5\) must be <= 1"),
    Bad("batch-above-dataset", fit(section("data", batch_size=5000)), r"exceeds the 1293 training.*--data.batch_size"),
    Bad("target-epsilon-unreachable", fit(dp(target_epsilon=1e-6)), r"target_epsilon=1e-06\) cannot be reached"),
    Bad("target-epsilon-negative", fit(dp(target_epsilon=-3.0)), r"target_epsilon=-3.0\) must be a finite number"),
    Bad("noise-and-target", fit(dp(noise_multiplier=1.0)), r"needs exactly one of noise_multiplier or target_eps"),
    Bad("neither-noise-nor-target", fit(dp(**NO_NOISE)), r"needs exactly one of noise_multiplier or target_epsilon"),
    Bad("unknown-accountant", fit(dp(accountant="moments")), r"accountant='moments'\) must be one of \('pld', 'rdp'"),
    Bad("unknown-clipping", fit(dp(clipping="nope")), r"clipping='nope'\) must be one of"),
    Bad("budget-below-one-step", fit(dp(**NO_NOISE, noise_multiplier=1.0, epsilon_budget=1e-4)),
        r"epsilon_budget=0.0001\) is smaller than the epsilon of a single step"),
    Bad("gradient-accumulation", fit(None, "--trainer.accumulate_grad_batches", "2"),
        r"accumulate_grad_batches=2\).*set accumulate_grad_batches=1"),
    Bad("lightning-gradient-clipping", fit(None, "--trainer.gradient_clip_val", "1.0"), r"gradient_clip_val=1.0\)"),
    Bad("accumulation-scheduler", fit(accumulation_scheduler), r"accumulate_grad_batches=2\) \(or a GradientAccumu"),
    Bad("precision-bf16-true", fit(None, "--trainer.precision", "bf16-true"), r"precision='bf16-true'\) breaks per-ex"),
    Bad("weighted-sampler-without-poisson", fit(edits(dp(poisson_sampling=False), digits_via("WeightedDigits"))),
        r"needs a uniform shuffle without replacement, but the train loader uses WeightedRandomSampler"),
    Bad("training-set-too-small", fit(edits(data(f"{HERE}.FiveDigits", data_dir=None, batch_size=2), dp(delta=None))),
        r"only 5 examples, so the default delta .* > 0.001"),
    # model and method
    Bad("unknown-architecture", fit(section("model", model="no_such_net")), r"unknown model 'no_such_net'.*list_mod"),
    Bad("residual-negative-gamma", fit(residual(gamma=-0.5)), r"gamma must be a finite number >= 0, got -0.5"),
    Bad("residual-zero-ensemble", fit(residual(ensemble_size=0)), r"ensemble_size must be an int >= 1, got 0"),
    Bad("residual-not-residual", fit(residual(model="cnn_tanh")), r"CNNTanh has no residual block to perturb"),
    Bad("residual-unknown-strategy", fit(residual(strategy="both")), r"Expected a typing.Literal\['additive'", True),
    Bad("non-positive-lr", fit(section("model", lr=0.0)), r"lr must be positive, got 0.0: set --model.lr"),
    Bad("zero-batch-size", fit(section("data", batch_size=0)), r"batch_size and eval_batch_size must be >= 1"),
    Bad("unknown-method", fit(unknown_method), r"has no attribute 'NoSuchMethod'", usage=True),
    Bad("unknown-optimizer", fit(section("model", optimizer="rmsprop")), r"Got value: rmsprop", usage=True),
    Bad("coupled-training-attack", fit(dpadv_with_autoattack),
        r"DPAdv\(attack='AutoAttack'\): AutoAttack cannot run on private training data.*Train with PGD"),
    # command line and config syntax
    Bad("unknown-config-key", fit(section("model", learning_rate=0.1)), r"learning_rate", usage=True),
    Bad("config-value-of-wrong-type", fit(section("model", lr="fast")), r"float'>. Got value: fast", usage=True),
    Bad("unknown-flag", fit(None, "--trainer.max_epochz", "3"), r"unrecognized arguments: --trainer.max", usage=True),
    Bad("flag-of-wrong-type", fit(None, "--trainer.max_epochs", "three"), r"max_epochs", usage=True),
    Bad("missing-config-file", lambda f, r: ["fit", "--config", "nothing.yaml"], r"nothing.yaml", usage=True),
    Bad("unknown-subcommand", lambda f, r: ["frobnicate"], r"invalid choice: 'frobnicate'", usage=True),
    Bad("certify-flag-of-wrong-type", evaluate("certify", good, "--n", "abc"), r"--n: invalid int value: 'abc'"),
    Bad("certify-negative-sigma", evaluate("certify", good, "--sigma", "-1"), r"--sigma must be a finite number > 0"),
    Bad("attack-unknown-name", evaluate("attack", good, "--attack", "NOPE"), r"--attack 'NOPE' is unknown: choose"),
    # data files
    Bad("mnist-missing", fit(data(MNIST)), r"MNIST not found in data_dir .*missing MNIST/raw/train-images.*data_dir"),
    Bad("mnist-truncated", fit(data(MNIST, mnist_with(cut_train_images))), r"train-images-idx3-ubyte .*truncated"),
    Bad("mnist-wrong-image-size", fit(data(MNIST, mnist_with(small_test_images))), r"shape \[27, 27\], expected 28x28"),
    Bad("mnist-labels-out-of-range", fit(data(MNIST, mnist_with(bad_test_labels))), r"class indices in \[0, 10\)"),
    Bad("cifar10-checksum-mismatch", fit(data("lightning_dprobust.data.CIFAR10DataModule", write_cifar)),
        r"data_batch_1 .*corrupt or incomplete: its MD5 sum differs"),
    Bad("nan-pixels", fit(digits_via("NaNPixelDigits")), r"NaN or infinite pixel values .*Fix the dataset or"),
    Bad("labels-out-of-range", fit(digits_via("OneBasedLabelDigits")), r"labels span \[1, 10\] but the model has 10"),
    Bad("wrong-image-size", fit(digits_via("PaddedDigits")), r"images of shape \(1, 10, 10\) .*built for \(1, 8, 8\)"),
    Bad("normalized-pixels", fit(digits_via("NormalizedDigits")), r"outside \[0, 1\].*remove Normalize"),
    Bad("idc-class-absent", fit(data("lightning_dprobust.data.IDCDataModule", negatives_only, train_size=0.4,
        test_size=0.25)), r"found no patch of class 1 .*<patient_id>/1/"),
    Bad("ehr-csv-infinite-value", ehr_csv_with("inf"), r"ehr.csv, line 12: value 'inf' \(patient 'p3'\) is not a fini"),
    Bad("ehr-csv-nan-value", ehr_csv_with("NaN"), r"ehr.csv, line 12: value 'NaN' \(patient 'p3'\) is not a finite"),
    # checkpoints
    Bad("resume-missing-checkpoint", fit(resume=lambda f, r: f / "nope.ckpt"), r"nope.ckpt (does not exist|not found)"),
    Bad("resume-truncated-checkpoint", fit(resume=damaged(truncate)), r"damaged.ckpt .*is truncated, damaged or not"),
    Bad("resume-pickled-code", fit(resume=damaged(with_code)), r"refusing to load checkpoint .*damaged.ckpt.*code"),
    Bad("resume-other-clip", fit(dp(max_grad_norm=2.0), resume=good), r"max_grad_norm=1.0 but this run has max_grad"),
    Bad("resume-other-accountant", fit(dp(accountant="prv"), resume=good), r"accountant='rdp' but this run has accou"),
    Bad("resume-non-private-checkpoint", fit(resume=damaged(without_dp_ledger)), r"holds no DP ledger"),
    Bad("resume-tiny-noise-under-target", fit(more_steps, resume=damaged(with_tiny_noise)), r"already spent epsilon"),
    Bad("resume-on-other-dataset", fit(data(MNIST, write_mnist), resume=good), r"written for another architecture"),
    Bad("certify-truncated-checkpoint", evaluate("certify", damaged(truncate)), r"is truncated, damaged or not a PyT"),
    Bad("attack-truncated-checkpoint", evaluate("attack", damaged(truncate)), r"is truncated, damaged or not a PyTo"),
    Bad("synthesize-truncated-release", truncated_release, r"release.pt \(\d+ bytes\) is truncated, damaged or not"),
    Bad("certify-pickled-code", evaluate("certify", damaged(with_code)), r"refusing to load checkpoint"),
    Bad("certify-wrong-architecture", evaluate("certify", damaged(resized)), r"written for another architecture .*sha"),
    Bad("certify-foreign-checkpoint", evaluate("certify", foreign), r"has no 'dprobust_class' entry"),
    Bad("certify-zoo-wrong-hash", evaluate("certify", tampered_zoo_cache), r"do not match the catalog's sha256"),
    Bad("certify-unknown-zoo-name", evaluate("certify", lambda f, r: "mlp_tanh.dpsgd_digits_eps4"), r"unknown zoo"),
    Bad("certify-nan-weights", evaluate("certify", damaged(nan_weight)), r"damaged.ckpt has non-finite weights"),
    Bad("attack-nan-weights", evaluate("attack", damaged(nan_weight)), r"damaged.ckpt has non-finite weights"),
    Bad("certify-no-hyper-parameters", evaluate("certify", damaged(without_hyper_parameters)),
        r"has no 'hyper_parameters'"),
    Bad("certify-other-dataset", on_mnist("certify"), r"takes inputs of shape \(1, 8, 8\) but --data mnist has"),
    Bad("attack-other-dataset", on_mnist("attack"), r"takes inputs of shape \(1, 8, 8\) but --data mnist has"),
    # newcomer path
    Bad("infinite-lr", fit(section("model", lr=float("inf"))), r"training stopped at epoch 0, step \d+: non-finite"),
    Bad("sample-rate-absurd", fit(dp(sample_rate=1e-6)), r"sample_rate=1e-06 .* 1,000,000 steps per epoch"),
    Bad("max-physical-batch-fractional", fit(dp(max_physical_batch_size=2.5)), r"max_physical_batch_size", usage=True),
    Bad("dp-in-trainer-callbacks", fit(dp_in_trainer_callbacks), r"DPCallback belongs in the `dp` group"),
    Bad("resume-last-without-checkpoint", fit(None, "--ckpt_path", "last"), r"--ckpt_path last: no last checkpoint"),
    Bad("fit-into-a-used-folder", in_used_folder, r"config.yaml already exists: this folder holds another"),
    Bad("predict-not-offered", lambda f, r: ["predict"], r"invalid choice: 'predict'", usage=True),
    Bad("certify-cuda-without-gpu", evaluate("certify", good, "--device", "cuda:7"), r"--device cuda:7: (no CUDA|on)"),
    Bad("certify-out-is-a-file", lambda f, r: ["certify", "--ckpt_path", str(r / LAST), "--out", str(a_file(f, r))],
        r"--out .*report.txt is a file: pass a folder"),
    Bad("audit-out-is-a-file", lambda f, r: ["audit", "--ckpt_path", str(r / LAST), "--out", str(a_file(f, r))],
        r"--out .*report.txt is a file: pass a folder"),
    Bad("evaluation-config-missing", evaluate("certify", good, "--config", "nothing.yaml"), r"--config nothing.yaml"),
    Bad("mnist-folder-for-a-file", fit(data(MNIST, mnist_with(folder_for_labels))),
        r"train-labels-idx1-ubyte is a folder, but a file"),
    # silent swaps and silently ignored values
    Bad("duplicated-yaml-key", duplicated_key, r"'seed_everything' appears twice in one mapping"),
    Bad("evaluation-config-duplicated-key", evaluation_config_with_duplicate,
        r"'sigma' appears twice in the same mapping"),
    Bad("poisson-sampling-as-a-word", fit(dp(poisson_sampling="no")), r"poisson_sampling: 'no' is ambiguous"),
    Bad("linked-num-classes-override", fit(section("model", num_classes=5)), r"num_classes=5 would be ignored"),
    Bad("resume-checkpoint-of-another-method", fit(other_method, resume=good),
        r"holds a DPSGD model but the config's method is DPCert"),
    Bad("resume-with-another-lr", fit(section("model", lr=0.1), "--trainer.max_steps", "8", resume=good),
        r"other hyperparameters: lr=0.1 \(checkpoint: 0.02\)"),
    Bad("resume-last-with-another-lr", last_with_other_lr, r"--ckpt_path last .*lr=0.1 \(checkpoint: 0.02\)"),
    Bad("resume-on-another-dataset-size", fit(section("data", train_part="private"), resume=good),
        r"trained on 1293 training examples but this run's data has 647"),
    Bad("audit-target-epsilon-without-dp", lambda f, r: ["audit", "--config", str(shortened(None, f)), "--canaries",
        "10", "--no_dp", "--dp.target_epsilon", "1"], r"--dp.target_epsilon 1 with --no_dp"),
    Bad("certify-denoiser-at-another-sigma", lambda f, r: ["certify", "--denoiser", DENOISER, "--sigma", "0.5"],
        r"--sigma 0.5 differs from the sigma=0.25 the --denoiser"),
    Bad("certify-denoiser-with-another-classifier", lambda f, r: ["certify", "--ckpt_path", "mlp_tanh.erm_digits",
        "--denoiser", DENOISER], r"mlp_tanh.erm_digits is not the classifier mlp_tanh.erm_digits_public"),
    Bad("resume-nan-weights", fit(more_steps, resume=damaged(nan_weight)), r"damaged.ckpt has non-finite weights \("),
    Bad("resume-foreign-hyperparameters", fit(more_steps, resume=damaged(with_foreign_hyperparameter)),
        r"holds hyperparameters that DPSGD does not take: \['bogus'\]"),
    Bad("transdenoiser-classifier-of-another-dataset",
        recipe("transdenoiser/digits.yaml", classifier=MNIST5K_CLASSIFIER),
        r"TransDenoiser\(classifier='cnn_tanh.erm_mnist5k'\) does not take inputs of shape \(1, 8, 8\)"),
    Bad("ain-target-of-another-dataset", recipe("ain/digits.yaml", target=MNIST5K_CLASSIFIER),
        r"AIN\(target='cnn_tanh.erm_mnist5k'\) does not take inputs of shape \(1, 8, 8\)"),
    Bad("attack-ain-of-another-dataset", lambda f, r: ["attack", "--ckpt_path", MNIST5K_CLASSIFIER, "--data", "mnist5k",
        "--attack", "AIN", "--ain", "ain_generator.ain_digits_target8", "--eps", "0.5", "--max_examples", "8",
        "--no-wandb"], r"--ain ain_generator.ain_digits_target8 was trained on inputs of shape \(1, 8, 8\) with 10 "
        r"classes, but the attacked images have \(1, 28, 28\)"),
    Bad("certify-foreign-hyperparameters", evaluate("certify", damaged(with_foreign_hyperparameter)),
        r"damaged.ckpt holds hyperparameters that DPSGD does not take: \['bogus'\]"),
    # nothing destroyed
    Bad("certify-out-holds-files", lambda f, r: ["certify", "--ckpt_path", str(r / LAST), "--out",
        str(a_file(f, r).parent)], r"--out .* already holds files.*--overwrite"),
    Bad("zoo-build-into-the-catalog", lambda f, r: ["zoo", "build", "mlp_tanh.dpsgd_digits_eps1", "--out",
        str(zoo.ZOO_DIR)], r"is the shipped catalog: .*--overwrite", usage=True),
]  # fmt: skip


def run_dprobust(args: list[str], folder: Path, monkeypatch, capsys) -> tuple[int, str]:
    monkeypatch.chdir(folder)
    monkeypatch.setenv("DPROBUST_HOME", str(folder / "home"))
    monkeypatch.setenv("DPROBUST_DATA", str(folder / "data"))
    capsys.readouterr()
    try:
        code = main(args)
    except SystemExit as exit_:  # argument-parser errors
        code = exit_.code
    return code, capsys.readouterr().err


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    """A folder where ``dprobust fit`` of the shipped config (one epoch) has written its checkpoints."""
    folder = tmp_path_factory.mktemp("finished")
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(folder)
        config = shortened(lambda c, f: c["trainer"].update(max_steps=-1, max_epochs=1), folder)
        assert main(["fit", "--config", str(config)]) == 0
    assert (folder / LAST).is_file()
    return folder


@pytest.mark.parametrize("bad", CATALOGUE, ids=[bad.id for bad in CATALOGUE])
def test_a_bad_input_exits_2_with_one_clear_message(bad, finished, tmp_path, monkeypatch, capsys):
    code, err = run_dprobust(bad.build(tmp_path, finished), tmp_path, monkeypatch, capsys)
    assert code == 2, err[-2000:]
    assert "Traceback" not in err
    assert not (tmp_path / "pwned").exists()
    if bad.usage:
        assert re.search(bad.phrase, err), err[-2000:]
        return
    lines = [line for line in err.splitlines() if line.startswith("dprobust: error:")]
    assert len(lines) == 1 and re.search(bad.phrase, lines[0]), err[-2000:]
    assert "Does not validate against any of the Union subtypes" not in err


def test_the_catalogue_documents_every_tested_input():
    documented = (ROOT / "docs" / "bad_inputs.md").read_text()
    assert len(CATALOGUE) >= 25
    assert [bad.id for bad in CATALOGUE if f"`{bad.id}`" not in documented] == []


# ------------------------------------------------------------------------------ nothing written is lost
REFUSED_IN_A_RUN_FOLDER = [
    "delta-at-least-1-over-n",
    "nan-pixels",
    "resume-other-clip",
    "resume-truncated-checkpoint",
    "resume-missing-checkpoint",
    "resume-pickled-code",
]


def snapshot(folder: Path) -> dict[str, tuple[int, str]]:
    return {
        str(path.relative_to(folder)): (path.stat().st_mtime_ns, hashlib.sha256(path.read_bytes()).hexdigest())
        for path in sorted((folder / "runs").rglob("*"))
        if path.is_file()
    }


def refuse_in_copy(case_id: str, finished: Path, tmp_path: Path, monkeypatch, capsys) -> tuple[dict, dict]:
    """Run the refused case in a copy of a finished run's folder; the folder's files before and after."""
    folder = tmp_path / "run"
    shutil.copytree(finished, folder, copy_function=shutil.copy2)
    before = snapshot(folder)
    bad = next(bad for bad in CATALOGUE if bad.id == case_id)
    code, err = run_dprobust(bad.build(folder, folder), folder, monkeypatch, capsys)
    assert code == 2, err[-2000:]
    return before, snapshot(folder)


@pytest.mark.parametrize("case_id", REFUSED_IN_A_RUN_FOLDER)
def test_a_refused_run_leaves_the_checkpoints_of_its_folder_untouched(case_id, finished, tmp_path, monkeypatch, capsys):
    before, after = refuse_in_copy(case_id, finished, tmp_path, monkeypatch, capsys)
    checkpoints = {name: state for name, state in before.items() if name.endswith(".ckpt")}
    assert len(checkpoints) == 2
    assert {name: state for name, state in after.items() if name.endswith(".ckpt")} == checkpoints


@pytest.mark.parametrize("case_id", ["delta-at-least-1-over-n", "resume-other-clip"])
def test_a_refused_run_keeps_the_config_of_the_run_that_wrote_the_folder(
    case_id, finished, tmp_path, monkeypatch, capsys
):
    before, after = refuse_in_copy(case_id, finished, tmp_path, monkeypatch, capsys)
    config = os.path.join("runs", "dpsgd-digits", "config.yaml")
    assert config in before and after[config] == before[config]
