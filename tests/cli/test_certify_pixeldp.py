"""``dprobust certify --method pixeldp`` end to end, on a fitted toy module that implements ``PixelDPMechanism``."""

from __future__ import annotations

import argparse
import csv
import time
from pathlib import Path
from types import SimpleNamespace

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from lightning_dprobust.cli import main
from lightning_dprobust.cli.certify_pixeldp import _psi
from lightning_dprobust.cli.loading import load_classifier
from lightning_dprobust.data import DigitsDataModule
from lightning_dprobust.methods import DPSGD
from lightning_dprobust.robustness.pixeldp import certify_pixeldp
from tests.helpers import digits, quiet_trainer, read_wandb_history, wandb_run_file
from tests.robustness.pixeldp_toys import ToyPixelDPClassifier

SKIP, MU_A = 12, (0.001, 0.05)  # the toy's radii are about 0.002 at n = 60
SMALL = ("--n", "60", "--skip", str(SKIP), "--batch_size", "600", "--no-progress", "--device", "cpu", "--seed", "2")
MODEL = {"model": "mlp_tanh", "num_classes": 10, "input_shape": (1, 8, 8), "optimizer": "adam", "lr": 0.01}


def _fit(root: Path, cls: type, **kwargs) -> Path:
    L.seed_everything(0, verbose=False)
    data = digits(batch_size=64)
    module = cls(mean=data.mean, std=data.std, **MODEL, **kwargs)
    saver = ModelCheckpoint(dirpath=root, filename=cls.__name__, save_top_k=1)
    quiet_trainer(root, max_epochs=2, enable_checkpointing=True, callbacks=[saver]).fit(module, data)
    return root / f"{cls.__name__}.ckpt"


@pytest.fixture(scope="module")
def toy_ckpt(tmp_path_factory) -> Path:
    return _fit(tmp_path_factory.mktemp("toy"), ToyPixelDPClassifier, noise_scale=0.2, psi=2.0)


def certify(out: Path, ckpt: Path, *extra: str) -> int:
    mu = [item for value in MU_A for item in ("--mu_a", str(value))]
    return main(["certify", "--method", "pixeldp", "--ckpt_path", str(ckpt), *SMALL, *mu, "--out", str(out), *extra])


def read_csv(path: Path) -> list[dict]:
    with path.open() as stream:
        return list(csv.DictReader(stream))


def logged_history(run_file: Path, timeout: float = 30.0) -> dict:
    """The logged values of an offline W&B run; W&B's service process can still be writing the file for a moment
    after ``run.finish()`` returns (seen with wandb 0.31 on a loaded machine), so poll until the history is there."""
    deadline = time.monotonic() + timeout
    while not (rows := read_wandb_history(run_file)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return {key: value for row in rows for key, value in row.items()}


def table(path: Path) -> dict[tuple[str, str], tuple[float, float]]:
    lines = [line for line in path.read_text().splitlines() if line.startswith("|")][2:]
    cells = [[cell.strip() for cell in line.strip("|").split("|")] for line in lines]
    return {(attack, mu): (float(conventional), float(certified)) for attack, mu, conventional, certified in cells}


@pytest.mark.parametrize("bound", ["clopper_pearson", "hoeffding"])
def test_certify_pixeldp_writes_the_certificates_of_certify_pixeldp_and_a_consistent_summary(toy_ckpt, tmp_path, bound):
    assert certify(tmp_path, toy_ckpt, "--no-wandb", "--bound", bound) == 0
    rows = read_csv(tmp_path / toy_ckpt.stem / "pixeldp.csv")
    data = DigitsDataModule()
    data.setup("test")
    x, y = data.test_set.tensors
    assert [int(row["index"]) for row in rows] == list(range(0, len(x), SKIP))
    model = load_classifier(str(toy_ckpt))
    direct = certify_pixeldp(model, x[::SKIP], y[::SKIP], n=60, eta=0.05, bound=bound, seed=2, batch_size=600)
    assert [int(row["prediction"]) for row in rows] == direct.prediction.tolist()
    assert [float(row["radius"]) for row in rows] == pytest.approx(direct.radius.tolist(), rel=1e-12)
    summary = table(tmp_path / toy_ckpt.stem / "summary.md")
    correct = torch.tensor([int(row["correct"]) for row in rows], dtype=torch.bool)
    for mu in MU_A:
        conventional, certified = summary[("clean", f"{mu:g}")]
        assert conventional == pytest.approx(100 * correct.float().mean().item(), abs=0.006)
        assert certified == pytest.approx(100 * (correct & (direct.radius >= mu)).float().mean().item(), abs=0.006)
        assert certified <= conventional
    assert summary[("clean", "0.001")][1] > 0 and summary[("clean", "0.05")][1] == 0


def test_strict_divides_the_radius_by_the_checkpoints_psi(toy_ckpt, tmp_path):
    assert certify(tmp_path / "paper", toy_ckpt, "--no-wandb") == 0
    assert certify(tmp_path / "strict", toy_ckpt, "--no-wandb", "--condition", "strict", "--eta", "0.1") == 0
    paper = read_csv(tmp_path / "paper" / toy_ckpt.stem / "pixeldp.csv")
    strict = read_csv(tmp_path / "strict" / toy_ckpt.stem / "pixeldp.csv")
    # strict splits eta over 2K bounds, paper over K: the same per-bound level at half the eta, so equal epsilon_r
    assert [row["epsilon_r"] for row in strict] == [row["epsilon_r"] for row in paper]
    assert [float(row["radius"]) for row in strict] == pytest.approx([float(row["radius"]) / 2 for row in paper])


def test_each_attack_is_certified_at_each_attack_size_and_logged(toy_ckpt, tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    assert certify(tmp_path, toy_ckpt, "--attack", "FGSM") == 0
    rows = read_csv(tmp_path / toy_ckpt.stem / "pixeldp.csv")
    groups = {(row["attack"], float(row["mu_a"])) for row in rows}
    assert groups == {("clean", 0.0), *(("FGSM", mu) for mu in MU_A)}
    summary = table(tmp_path / toy_ckpt.stem / "summary.md")
    assert set(summary) == {(attack, f"{mu:g}") for attack in ("clean", "FGSM") for mu in MU_A}
    assert all(certified <= conventional for conventional, certified in summary.values())
    run_file = wandb_run_file(tmp_path)
    logged = logged_history(run_file)
    conventional = logged[f"{toy_ckpt.stem}/FGSM@0.05/conventional_acc"]
    assert 100 * conventional == pytest.approx(summary[("FGSM", "0.05")][0], abs=0.006)


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (("--eta", "1.5"), "--eta"),
        (("--n", "0"), "--n"),
        (("--mu_a", "-0.1"), "--mu_a"),
        (("--psi", "0.5"), "--psi"),
        (("--sigma", "0.5"), "--sigma"),
        (("--condition", "strict", "--psi", "3"), "--psi"),
        (("--bound", "wald"), "--bound"),
        (("--attack", "PGDL2"), "--attack PGDL2"),
        (("--attack", "CW"), "--attack CW"),
        (("--attack", "nosuch"), "--attack"),
    ],
)
def test_bad_pixeldp_flags_exit_2_naming_the_flag(toy_ckpt, tmp_path, capsys, flags, named):
    assert certify(tmp_path / "out", toy_ckpt, "--no-wandb", *flags) == 2
    message = capsys.readouterr().err
    assert named in message and "Traceback" not in message and len(message.strip().splitlines()) == 1


def test_pixeldp_flags_are_refused_with_the_default_cohen_method(toy_ckpt, tmp_path, capsys):
    assert main(["certify", "--ckpt_path", str(toy_ckpt), "--eta", "0.05", "--out", str(tmp_path), "--no-wandb"]) == 2
    assert "--eta" in capsys.readouterr().err


def test_a_module_without_the_protocol_is_refused_in_one_line(tmp_path, capsys):
    ckpt = _fit(tmp_path, DPSGD)
    assert certify(tmp_path / "out", ckpt, "--no-wandb") == 2
    message = capsys.readouterr().err
    assert "DPSGD does not implement PixelDPMechanism" in message and len(message.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


def test_strict_without_psi_anywhere_is_refused(tmp_path):
    args = argparse.Namespace(condition="strict", psi=None)
    with pytest.raises(ValueError, match="--condition strict needs the fresh-noise shrink factor: pass --psi"):
        _psi(SimpleNamespace(hparams={}), args)
    assert _psi(SimpleNamespace(hparams={}), argparse.Namespace(condition="strict", psi=3.0)) == 3.0
    assert _psi(SimpleNamespace(hparams={"psi": 2.0}), args) == 2.0
