"""``dprobust synthesize``: a long-format CSV from an IGAMT checkpoint's released artifact, raw units with a schema."""

from __future__ import annotations

import csv
import re

import pytest
import torch

from lightning_dprobust.cli.main import main
from lightning_dprobust.cli.synthesize import SCALED_NOTE, SCHEMA_NOTE, load_release, scaling_note
from lightning_dprobust.recipes import CONFIG_DIR
from tests.helpers import quiet_trainer
from tests.methods.igamt_helpers import EHRData, small

SCHEMA = {
    "feature_names": ["increment", "hr", "sbp", "dbp", "temp", "o2"],
    "static": [
        {"name": "age", "start": 0, "categories": (), "low": 20.0, "high": 80.0},
        {"name": "gender", "start": 1, "categories": ("F", "M"), "low": 0.0, "high": 1.0},
    ],
    "temporal_low": [0.0, 40.0, 80.0, 40.0, 35.0, 80.0],
    "temporal_high": [10.0, 160.0, 200.0, 120.0, 41.0, 100.0],
}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    folder = tmp_path_factory.mktemp("igamt")
    module = small(noise_multiplier=None)
    trainer = quiet_trainer(folder, max_epochs=1)
    trainer.fit(module, EHRData())
    trainer.save_checkpoint(folder / "plain.ckpt")
    saved = torch.load(folder / "plain.ckpt", weights_only=True)
    saved["ehr_schema"] = SCHEMA
    torch.save(saved, folder / "schema.ckpt")
    return folder


def read(path):
    with path.open() as stream:
        return list(csv.DictReader(stream))


def test_csv_in_scaled_units_matches_the_release(checkpoint, tmp_path, capsys):
    out = tmp_path / "synthetic.csv"
    assert (
        main(
            ["synthesize", "--ckpt_path", str(checkpoint / "plain.ckpt"), "--n", "7", "--out", str(out), "--seed", "3"]
        )
        == 0
    )
    assert SCALED_NOTE in capsys.readouterr().out
    rows = read(out)
    assert list(rows[0]) == ["patient", "time", "feature", "value", "static_0", "static_group_0"]
    x, m = load_release(checkpoint / "plain.ckpt").sample(7, generator=torch.Generator().manual_seed(3))
    assert len(rows) == int(m[:, 1:, 1:].sum())
    for row in rows[:20]:
        patient, feature = int(row["patient"]), int(row["feature"].split("_")[1])
        observed = [k for k in range(1, x.shape[1]) if m[patient, k, feature] > 0.5]
        assert any(abs(float(row["value"]) - float(x[patient, k, feature])) < 1e-5 for k in observed)
        assert row["static_group_0"] == f"category_{int(x[patient, 0, 1:3].argmax())}"


def test_csv_in_raw_units_with_the_schema(checkpoint, tmp_path, capsys):
    out = tmp_path / "raw.csv"
    assert (
        main(
            ["synthesize", "--ckpt_path", str(checkpoint / "schema.ckpt"), "--n", "5", "--out", str(out), "--seed", "1"]
        )
        == 0
    )
    printed = capsys.readouterr().out
    assert SCALED_NOTE not in printed and SCHEMA_NOTE in printed  # SCHEMA declares its ranges: nothing derived
    rows = read(out)
    assert list(rows[0])[4:] == ["age", "gender"] and {r["gender"] for r in rows} <= {"F", "M"}
    assert all(20.0 <= float(r["age"]) <= 80.0 for r in rows)
    assert rows and {r["feature"] for r in rows} <= set(SCHEMA["feature_names"][1:])
    for row in rows:
        j = SCHEMA["feature_names"].index(row["feature"])
        assert SCHEMA["temporal_low"][j] <= float(row["value"]) <= SCHEMA["temporal_high"][j]
    times = [float(r["time"]) for r in rows]
    assert all(0.0 <= t <= 10.0 * 5 for t in times)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--n", "0"], "--n"),
        (["--steps", "99"], "--steps"),
        (["--steps", "0"], "--steps"),  # 0 was read as "the model's max_steps"
    ],
)
def test_bad_flags_are_refused_in_one_line(checkpoint, tmp_path, capsys, flags, message):
    argv = ["synthesize", "--ckpt_path", str(checkpoint / "plain.ckpt"), "--out", str(tmp_path / "a.csv"), *flags]
    assert main(argv) == 2
    error = capsys.readouterr().err.strip()
    assert message in error and "\n" not in error


def test_the_note_names_the_scalers_read_from_the_training_records():
    assert scaling_note(SCHEMA) == SCHEMA_NOTE
    derived = scaling_note(SCHEMA | {"data_derived": ("hr", "age")})
    assert "['hr', 'age'] were read from the training records" in derived and "not differentially private" in derived


def test_missing_or_foreign_checkpoints_are_refused(tmp_path, capsys):
    assert main(["synthesize", "--ckpt_path", str(tmp_path / "none.ckpt"), "--out", str(tmp_path / "a.csv")]) == 2
    assert "does not exist" in capsys.readouterr().err
    torch.save({"state_dict": {}, "hyper_parameters": {"lr": 0.1}}, tmp_path / "other.ckpt")
    assert main(["synthesize", "--ckpt_path", str(tmp_path / "other.ckpt"), "--out", str(tmp_path / "a.csv")]) == 2
    assert "neither an IGAMT checkpoint" in capsys.readouterr().err


def _release(folder) -> dict:
    """The zoo's IGAMT release saved as a file in ``folder``, read back as a dictionary."""
    from lightning_dprobust import zoo

    zoo.load("igamt.dp_synthetic_ehr_s10").save(folder / "release.pt")
    return torch.load(folder / "release.pt", weights_only=True)


def _cut(fraction):
    def damage(folder, release, checkpoint):
        data = (folder / "release.pt").read_bytes()
        (folder / "release.pt").write_bytes(data[: int(len(data) * fraction)])

    return damage


def _edited(change):
    def damage(folder, release, checkpoint):
        torch.save(change(dict(release)), folder / "release.pt")

    return damage


def _checkpoint_edited(change):
    def damage(folder, release, checkpoint):
        saved = torch.load(checkpoint / "plain.ckpt", weights_only=True)
        torch.save(change(saved), folder / "release.pt")

    return damage


def _cut_checkpoint(folder, release, checkpoint):
    data = (checkpoint / "plain.ckpt").read_bytes()
    (folder / "release.pt").write_bytes(data[: len(data) // 2])


def _resized(release):
    return release | {"state": {key: value[..., :1] for key, value in release["state"].items()}}


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (_cut(0.1), "is truncated, damaged or not a PyTorch checkpoint"),
        (_cut(0.9), "is truncated, damaged or not a PyTorch checkpoint"),
        (_cut(0.0), "is empty|is truncated, damaged or not a PyTorch checkpoint"),
        (_edited(lambda r: {k: v for k, v in r.items() if k != "config"}), "release .* has no 'config'"),
        (_edited(lambda r: r | {"config": "abc"}), "release .* has no 'config'"),
        (_edited(lambda r: r | {"config": {k: v for k, v in r["config"].items() if k != "d_model"}}),
         r"release .* config lacks \['d_model'\]"),
        (_edited(lambda r: r | {"config": r["config"] | {"bogus": 1}}),
         r"release .* config holds unknown keys \['bogus'\]"),
        (_edited(lambda r: r | {"state": {}}), "written for another architecture .*missing"),
        (_edited(_resized), "written for another architecture .*shape"),
        (_cut_checkpoint, "is truncated, damaged or not a PyTorch checkpoint"),
        (_checkpoint_edited(lambda c: c | {"state_dict": {}}), "written for another architecture .*missing"),
        (_checkpoint_edited(lambda c: c | {"hyper_parameters": c["hyper_parameters"] | {"bogus": 1}}),
         r"holds hyperparameters that IGAMT does not take: \['bogus'\]"),
    ],
    ids=["cut-10%", "cut-90%", "empty", "no-config", "config-not-a-dict", "config-lacks-a-key", "config-unknown-key",
         "no-state", "resized-state", "truncated-igamt-checkpoint", "igamt-checkpoint-without-weights",
         "igamt-checkpoint-foreign-hyperparameter"],
)  # fmt: skip
def test_a_damaged_release_or_checkpoint_is_one_line_exit_2(damage, message, checkpoint, tmp_path, capsys):
    """Each used to be a traceback (KeyError, EOFError, a load_state_dict page), an errno line or silence."""
    damage(tmp_path, _release(tmp_path), checkpoint)
    capsys.readouterr()
    out = tmp_path / "synthetic.csv"
    assert main(["synthesize", "--ckpt_path", str(tmp_path / "release.pt"), "--n", "2", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("dprobust: error:") and "\n" not in err and "Traceback" not in err, err[-2000:]
    assert re.search(message, err) and "release.pt" in err, err
    assert not out.exists()


@pytest.mark.parametrize(
    ("config", "extra"),
    [
        ("igamt/synthetic.yaml", []),
        ("igamt/synthetic.yaml", ["--model.init_args.latent", "per_step"]),
        ("igamt/baselines/vae.yaml", []),
    ],
    ids=["igamt", "igamt-per-step", "vae"],
)
def test_a_checkpoint_written_by_dprobust_fit_synthesizes(tmp_path, monkeypatch, config, extra):
    """The documented path: ``dprobust fit`` (LightningCLI adds ``_class_path`` to the saved hyperparameters), then
    ``dprobust synthesize --ckpt`` on its ``last.ckpt``."""
    monkeypatch.chdir(tmp_path)
    fit = ["fit", "--config", str(CONFIG_DIR / config), "--trainer.max_steps", "2", "--trainer.logger", "false"]
    assert main([*fit, *extra, "--trainer.enable_progress_bar", "false"]) == 0
    (last,) = tmp_path.glob("runs/*/checkpoints/last.ckpt")
    if extra:
        assert load_release(last).config["latent"] == "per_step"
    out = tmp_path / "synthetic.csv"
    assert main(["synthesize", "--ckpt_path", str(last), "--n", "3", "--out", str(out), "--seed", "0"]) == 0
    rows = read(out)
    assert rows and {int(row["patient"]) for row in rows} <= {0, 1, 2}


def test_a_zoo_synthesizer_synthesizes_by_its_name(tmp_path, capsys):
    out = tmp_path / "synthetic.csv"
    assert main(["synthesize", "--ckpt_path", "igamt.dp_synthetic_ehr_s10", "--n", "2", "--out", str(out)]) == 0
    assert read(out)
    assert main(["synthesize", "--ckpt_path", "igamt.no_such_entry", "--out", str(tmp_path / "b.csv")]) == 2
    assert "is not a zoo entry" in capsys.readouterr().err


def test_synthesize_never_destroys_a_file(checkpoint, tmp_path, capsys):
    source = checkpoint / "plain.ckpt"
    before = source.read_bytes()
    assert main(["synthesize", "--ckpt_path", str(source), "--out", str(source), "--overwrite"]) == 2
    assert "is the --ckpt_path file itself" in capsys.readouterr().err and source.read_bytes() == before
    out = tmp_path / "kept.csv"
    out.write_text("earlier work\n")
    assert main(["synthesize", "--ckpt_path", str(source), "--n", "2", "--out", str(out)]) == 2
    assert "exists" in capsys.readouterr().err and out.read_text() == "earlier work\n"
    assert main(["synthesize", "--ckpt_path", str(source), "--n", "2", "--out", str(out), "--overwrite"]) == 0
    assert out.read_text() != "earlier work\n"
