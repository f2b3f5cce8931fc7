"""``dprobust certify`` and ``dprobust attack`` on digits checkpoints written by a real Lightning fit."""

from __future__ import annotations

import csv
from pathlib import Path

import lightning as L
import pytest
import torch
import torchattacks
from lightning.pytorch.callbacks import ModelCheckpoint

from lightning_dprobust.cli import main
from lightning_dprobust.cli.loading import load_classifier
from lightning_dprobust.core.smoothing import ABSTAIN
from lightning_dprobust.data import DigitsDataModule
from lightning_dprobust.methods import DPSGD
from lightning_dprobust.robustness.certify import CSV_COLUMNS
from tests.helpers import digits, quiet_trainer, read_wandb_history, wandb_run_file

RADII = {"0": 0.0, "0.25": 0.25, "0.5": 0.5, "0.75": 0.75, "1": 1.0}
SKIP = 20
ROUNDING = 6e-5  # tables show 2 decimals of a percentage (4 of ACR): half a unit in the last place, plus slack
SMALL = ("--n0", "20", "--n", "200", "--skip", str(SKIP), "--batch_size", "100", "--no-progress", "--device", "cpu")


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> list[Path]:
    """DPSGD trained without DPCallback (non-private) for 2 epochs; the checkpoints after epoch 0 and epoch 1."""
    root = tmp_path_factory.mktemp("fit")
    L.seed_everything(0, verbose=False)
    data = digits(batch_size=32)
    module = DPSGD(
        model="mlp_tanh", num_classes=10, input_shape=(1, 8, 8), mean=data.mean, std=data.std, optimizer="adam", lr=0.01
    )
    saver = ModelCheckpoint(dirpath=root, filename="epoch{epoch}", auto_insert_metric_name=False, save_top_k=-1)
    quiet_trainer(root, max_epochs=2, enable_checkpointing=True, callbacks=[saver]).fit(module, data)
    return [root / "epoch0.ckpt", root / "epoch1.ckpt"]


@pytest.fixture(scope="module")
def digits_test_split() -> tuple[torch.Tensor, torch.Tensor]:
    data = DigitsDataModule()
    data.setup("test")
    return data.test_set.tensors


def certify(out: Path, *ckpts: Path, extra: tuple[str, ...] = ("--no-wandb",)) -> int:
    flags = [item for ckpt in ckpts for item in ("--ckpt_path", str(ckpt))]
    return main(["certify", *flags, *SMALL, "--out", str(out), *extra])


def read_rows(path: Path) -> tuple[list[str], list[dict]]:
    with path.open() as stream:
        reader = csv.DictReader(stream)
        rows = [{key: float(value) for key, value in row.items()} for row in reader]
        return list(reader.fieldnames), rows


def recompute(rows: list[dict]) -> dict[str, float]:
    """Certified accuracy at each radius and ACR from the CSV, by their definitions (Cohen 2019; Zhai 2020)."""
    hits = [row for row in rows if row["prediction"] == row["label"] and row["prediction"] != ABSTAIN]
    summary = {f"certified_acc@{key}": sum(row["radius"] >= r for row in hits) / len(rows) for key, r in RADII.items()}
    return summary | {"acr": sum(row["radius"] for row in hits) / len(rows)}


def table(path: Path) -> list[list[str]]:
    lines = [line for line in path.read_text().splitlines() if line.startswith("|")]
    return [[cell.strip() for cell in line.strip("|").split("|")] for line in lines[:1] + lines[2:]]


def test_certify_writes_one_row_per_example_a_consistent_summary_and_one_plot(
    checkpoints, digits_test_split, tmp_path, capsys
):
    assert certify(tmp_path, *checkpoints) == 0
    printed = capsys.readouterr().out
    images, labels = digits_test_split
    for ckpt in checkpoints:
        columns, rows = read_rows(tmp_path / ckpt.stem / "certify.csv")
        assert tuple(columns) == CSV_COLUMNS
        assert [int(row["index"]) for row in rows] == list(range(0, len(labels), SKIP))
        assert [int(row["label"]) for row in rows] == labels[::SKIP].tolist()
        assert all(row["radius"] == 0.0 for row in rows if row["prediction"] == ABSTAIN)
        assert all(row["correct"] == (row["prediction"] == row["label"]) for row in rows)
        assert any(row["radius"] > 0.25 for row in rows), "the trained model should certify some examples"
        header, values = table(tmp_path / ckpt.stem / "summary.md")
        expected = recompute(rows)
        shown = [float(v) / 100 for v in values[2:-1]] + [float(values[-1])]
        assert header[0] == "model" and values[:2] == [ckpt.stem, str(len(rows))]
        assert shown == pytest.approx(list(expected.values()), abs=ROUNDING)
        assert f"| {ckpt.stem} | {len(rows)} | {values[2]} |" in printed
    assert (tmp_path / "certified_accuracy.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert str(tmp_path / "certified_accuracy.png") in printed


def test_the_same_seed_gives_the_same_certificates(checkpoints, tmp_path):
    runs = {"a": ("--seed", "3"), "b": ("--seed", "3"), "c": ("--seed", "4")}
    results = {}
    for name, seed in runs.items():
        assert certify(tmp_path / name, checkpoints[1], extra=("--no-wandb", *seed)) == 0
        rows = read_rows(tmp_path / name / "epoch1" / "certify.csv")[1]
        results[name] = [(row["index"], row["prediction"], row["radius"]) for row in rows]
    assert results["a"] == results["b"]
    assert results["a"] != results["c"]


def test_certify_logs_the_summary_and_the_plot_to_an_offline_wandb_run(checkpoints, tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    assert certify(tmp_path, checkpoints[1], extra=()) == 0
    run_file = wandb_run_file(tmp_path)
    logged = {key: value for row in read_wandb_history(run_file) for key, value in row.items()}
    rows = read_rows(tmp_path / "epoch1" / "certify.csv")[1]
    expected = recompute(rows)
    assert {key: logged[f"epoch1/{key}"] for key in expected} == pytest.approx(expected, abs=1e-6)
    assert logged["epoch1/num_examples"] == len(rows)
    assert logged["certified_accuracy/_type"] == "image-file"
    image = run_file.parent / "files" / logged["certified_accuracy/path"]
    assert image.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (("--sigma", "-1"), "--sigma"),
        (("--alpha", "1.5"), "--alpha"),
        (("--n0", "0"), "--n0"),
        (("--n", "0"), "--n"),
        (("--skip", "0"), "--skip"),
        (("--max_examples", "0"), "--max_examples"),
        (("--data", "no_such_data"), "--data"),
    ],
)
def test_bad_certify_flags_exit_2_naming_the_flag(checkpoints, tmp_path, capsys, flags, named):
    assert certify(tmp_path / "out", checkpoints[1], extra=flags) == 2
    message = capsys.readouterr().err
    assert named in message and "Traceback" not in message
    assert not (tmp_path / "out").exists()


def test_a_missing_checkpoint_exits_2_naming_the_file(checkpoints, tmp_path, capsys):
    missing = tmp_path / "missing.ckpt"
    assert certify(tmp_path / "out", checkpoints[1], missing) == 2
    message = capsys.readouterr().err
    assert str(missing) in message and "--ckpt_path" in message
    assert not (tmp_path / "out").exists()


def test_attack_reports_clean_and_each_attack_and_logs_them(
    checkpoints, digits_test_split, tmp_path, monkeypatch, capsys
):
    monkeypatch.setenv("WANDB_MODE", "offline")
    flags = ["--attack", "FGSM", "--attack", "pgd", "--eps", "0.1", "--steps", "5", "--max_examples", "64"]
    assert (
        main(["attack", "--ckpt_path", str(checkpoints[1]), *flags, "--batch_size", "32", "--out", str(tmp_path)]) == 0
    )
    header, *rows = table(tmp_path / "epoch1" / "attack.md")
    accuracy = {name: float(value) / 100 for name, value in rows}
    assert header == ["attack", "accuracy (%)"] and list(accuracy) == ["clean", "FGSM", "PGD"]
    images, labels = digits_test_split
    with torch.no_grad():
        clean = (load_classifier(str(checkpoints[1]))(images[:64]).argmax(1) == labels[:64]).float().mean().item()
    assert accuracy["clean"] == pytest.approx(clean, abs=ROUNDING)
    assert accuracy["PGD"] < accuracy["clean"]
    assert "| PGD |" in capsys.readouterr().out
    run_file = wandb_run_file(tmp_path)
    logged = {key: value for row in read_wandb_history(run_file) for key, value in row.items()}
    assert logged["epoch1/clean_acc"] == pytest.approx(clean)
    assert logged["epoch1/robust_acc/PGD"] == pytest.approx(accuracy["PGD"], abs=ROUNDING)


@pytest.mark.parametrize(("flags", "named"), [(("--attack", "nope"), "--attack"), (("--eps", "-0.1"), "--eps")])
def test_bad_attack_flags_exit_2_naming_the_flag(checkpoints, tmp_path, capsys, flags, named):
    assert (
        main(["attack", "--ckpt_path", str(checkpoints[1]), *flags, "--out", str(tmp_path / "out"), "--no-wandb"]) == 2
    )
    message = capsys.readouterr().err
    assert named in message and "Traceback" not in message


def attack_outputs(monkeypatch, cls) -> list[torch.Tensor]:
    """Every adversarial batch ``cls`` returns from now on."""
    outputs, forward = [], cls.forward

    def recording(self, images, labels):
        outputs.append(forward(self, images, labels))
        return outputs[-1]

    monkeypatch.setattr(cls, "forward", recording)
    return outputs


def test_an_attack_gives_the_same_views_whatever_other_attacks_are_requested(checkpoints, tmp_path, monkeypatch):
    outputs = attack_outputs(monkeypatch, torchattacks.PGD)
    common = ["--ckpt_path", str(checkpoints[1]), "--eps", "0.1", "--steps", "2", "--max_examples", "32", "--no-wandb"]
    for others in ([], ["--attack", "PGDL2", "--attack", "FGSM"]):
        assert main(["attack", *common, *others, "--attack", "PGD", "--out", str(tmp_path / str(len(others)))]) == 0
    assert len(outputs) == 2 and torch.equal(outputs[0], outputs[1])
    assert main(["attack", *common, "--attack", "PGD", "--seed", "1", "--out", str(tmp_path / "seed1")]) == 0
    assert not torch.equal(outputs[0], outputs[2])


def test_cw_honours_steps(checkpoints, tmp_path, monkeypatch):
    steps, init = [], torchattacks.CW.__init__

    def recording(self, *args, **kwargs):
        init(self, *args, **kwargs)
        steps.append(self.steps)

    monkeypatch.setattr(torchattacks.CW, "__init__", recording)
    flags = ["--attack", "CW", "--steps", "3", "--max_examples", "8", "--no-wandb", "--out", str(tmp_path)]
    assert main(["attack", "--ckpt_path", str(checkpoints[1]), *flags]) == 0
    assert steps == [3]
