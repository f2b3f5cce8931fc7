"""``dprobust zoo``: the table, info, download and build subcommands, and their errors."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from lightning_dprobust import zoo
from lightning_dprobust.cli.zoo import format_table, table_rows, zoo_command
from lightning_dprobust.zoo import build as zoo_build


def run(capsys, *argv: str) -> tuple[int, str, str]:
    try:
        zoo_command(list(argv))
        code = 0
    except SystemExit as exit_:
        code = exit_.code
    out, err = capsys.readouterr()
    return code, out, err


def test_list_prints_one_row_per_entry_under_a_header(capsys):
    code, out, _ = run(capsys, "list")
    lines = out.splitlines()
    assert code == 0
    assert lines[0].split() == ["name", "status", "dataset", "epsilon", "metrics"]
    assert [line.split()[0] for line in lines[1:]] == [entry.name for entry in zoo.list_entries()]
    mnist = next(line for line in lines if line.startswith("cnn_tanh.dpsgd_mnist_eps1 "))
    assert mnist.split()[1:3] == ["recipe", "mnist"]
    assert "1 (target)" in mnist and "test_acc=0.972" in mnist


def test_list_filters_by_pattern_and_fails_when_nothing_matches(capsys):
    code, out, _ = run(capsys, "list", "*.dpsgd_mnist_*")
    assert code == 0 and [line.split()[0] for line in out.splitlines()[1:]] == ["cnn_tanh.dpsgd_mnist_eps1"]
    code, _, err = run(capsys, "list", "nothing*")
    assert code == 2 and "no zoo entry matches 'nothing*'" in err


def test_table_rows_show_measured_metrics_and_epsilon_for_shipped_entries():
    data = zoo.info("cnn_tanh.dpsgd_mnist_eps1").to_dict()
    file = "cnn_tanh.dpsgd_mnist_eps1-00000000.pth"
    data.update(status="shipped", file=file, url=f"weights/{file}", sha256="0" * 64)
    data["meta"]["metrics"] = {"test_acc": 0.9612}
    data["meta"]["privacy"]["epsilon"] = 0.9987
    entry = zoo.Entry.from_dict(data)
    (row,) = table_rows([entry])
    assert row[3] == "0.999" and row[4] == "test_acc=0.9612"
    assert format_table([row]).splitlines()[1].split()[:2] == ["cnn_tanh.dpsgd_mnist_eps1", "shipped"]


def test_list_shows_the_recorded_epsilon_not_the_rounded_target():
    for entry in zoo.list_entries():
        if entry.shipped and entry.meta["privacy"] is not None:
            (row,) = table_rows([entry])
            if entry.meta["privacy"]["accountant"] == "nominal":  # a claim, shown as no guarantee
                assert row[3] == f"{entry.meta['privacy']['epsilon']:.3f} nominal (no DP guarantee)"
                continue
            assert row[3] == f"{entry.meta['privacy']['epsilon']:.3f}"
            if entry.meta["privacy"]["accountant"] != "laplace":  # a pure-DP budget (StoBatch) is spent exactly
                assert float(row[3]) != round(float(row[3]))


def test_info_prints_the_entry_as_yaml(capsys):
    code, out, _ = run(capsys, "info", "cnn_tanh.dpsgd_fashion_mnist_eps3")
    assert code == 0 and yaml.safe_load(out) == zoo.info("cnn_tanh.dpsgd_fashion_mnist_eps3").to_dict()


def test_errors_exit_2_with_one_line_on_stderr(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("DPROBUST_HOME", str(tmp_path))
    code, _, err = run(capsys, "download", "cnn_tanh.dpsgd_mnist_eps1")
    assert code == 2 and "dprobust zoo build cnn_tanh.dpsgd_mnist_eps1" in err and len(err.splitlines()) == 1
    code, _, err = run(capsys, "info", "cnn_tanh.dpsgd_mnist_eps2")
    assert code == 2 and "Did you mean: cnn_tanh.dpsgd_mnist_eps1" in err
    code, _, _ = run(capsys, "frobnicate")
    assert code == 2


def test_download_prints_the_cached_path(capsys, monkeypatch, tmp_path):
    shipped = [entry for entry in zoo.list_entries() if entry.status == "shipped"]
    if not shipped:
        pytest.skip("no shipped entry yet")
    monkeypatch.setenv("DPROBUST_HOME", str(tmp_path))
    code, out, _ = run(capsys, "download", shipped[0].name)
    assert code == 0 and Path(out.strip()) == tmp_path / "zoo" / shipped[0].file and Path(out.strip()).is_file()


def test_build_passes_its_options_through(capsys, monkeypatch, tmp_path):
    calls = []
    entry = zoo.info("cnn_tanh.dpsgd_mnist_eps1")

    def fake_build(name, *, epochs, out_dir):
        calls.append((name, epochs, out_dir))
        return entry

    monkeypatch.setattr(zoo_build, "build", fake_build)
    code, out, _ = run(capsys, "build", entry.name, "--epochs", "3", "--out", str(tmp_path))
    assert code == 0 and calls == [(entry.name, 3, str(tmp_path))]
    assert entry.name in out
