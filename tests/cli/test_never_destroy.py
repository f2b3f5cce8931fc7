"""Nothing written is lost, and one dialect: every evaluation run gets a folder of its own, nothing is overwritten
without ``--overwrite``, Ctrl-C keeps what was finished, an interrupted or stalled download leaves no partial file;
the old flag spellings warn once; ``--help``, ``--version`` and ``zoo list`` load neither torch nor Lightning."""

from __future__ import annotations

import csv
import http.server
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from lightning_dprobust import zoo
from lightning_dprobust.cli import main
from lightning_dprobust.cli.args import DATA_NAMES
from lightning_dprobust.core import smoothing
from lightning_dprobust.zoo import build as zoo_build
from lightning_dprobust.zoo import hub

CLASSIFIER = "mlp_tanh.erm_digits"
SMALL = ["--n0", "10", "--n", "20", "--max_examples", "3", "--no-progress", "--device", "cpu", "--no-wandb"]


@pytest.fixture
def workdir(tmp_path, monkeypatch) -> Path:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DPROBUST_HOME", str(tmp_path / "home"))
    return tmp_path


def rows(path: Path) -> list[dict]:
    with path.open() as stream:
        return list(csv.DictReader(stream))


def test_each_certify_run_gets_a_new_folder(workdir):
    assert main(["certify", "--ckpt_path", CLASSIFIER, *SMALL]) == 0
    assert main(["certify", "--ckpt_path", CLASSIFIER, *SMALL]) == 0
    first, second = (workdir / "runs" / "certify" / f"{CLASSIFIER}-{n}" / CLASSIFIER / "certify.csv" for n in (1, 2))
    assert len(rows(first)) == len(rows(second)) == 3


def test_attack_runs_get_new_folders_too(workdir):
    for _ in range(2):
        assert main(["attack", "--ckpt_path", CLASSIFIER, "--max_examples", "4", "--no-wandb", "--device", "cpu"]) == 0
    assert sorted(path.name for path in (workdir / "runs" / "attack").iterdir()) == [
        f"{CLASSIFIER}-1",
        f"{CLASSIFIER}-2",
    ]


def test_an_out_folder_that_holds_files_needs_overwrite(workdir, capsys):
    out = workdir / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    assert main(["certify", "--ckpt_path", CLASSIFIER, *SMALL, "--out", str(out)]) == 2
    assert "already holds files" in capsys.readouterr().err and not (out / CLASSIFIER).exists()
    assert main(["certify", "--ckpt_path", CLASSIFIER, *SMALL, "--out", str(out), "--overwrite"]) == 0
    assert (out / CLASSIFIER / "certify.csv").is_file() and (out / "notes.txt").read_text() == "keep me"


def test_ctrl_c_during_certify_writes_the_finished_examples_and_exits_130(workdir, monkeypatch, capsys):
    certify, calls = smoothing.Smooth.certify, []

    def interrupted_at_the_third(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return certify(self, *args, **kwargs)

    monkeypatch.setattr(smoothing.Smooth, "certify", interrupted_at_the_third)
    assert main(["certify", "--ckpt_path", CLASSIFIER, *SMALL]) == 130
    err = capsys.readouterr().err.strip()
    assert err.startswith("dprobust: certify interrupted: 2 certified example(s) written to") and "\n" not in err
    written = workdir / "runs" / "certify" / f"{CLASSIFIER}-1" / CLASSIFIER
    assert len(rows(written / "certify.csv")) == 2 and (written / "summary.md").is_file()


def test_zoo_build_writes_to_a_new_user_folder_and_the_catalog_only_with_overwrite(workdir, monkeypatch, capsys):
    calls = []
    entry = zoo.info("mlp_tanh.dpsgd_digits_eps1")
    monkeypatch.setattr(zoo_build, "build", lambda name, *, epochs, out_dir: calls.append(out_dir) or entry)
    assert main(["zoo", "build", entry.name, "--epochs", "1"]) == 0
    assert calls == [str(Path("runs") / "zoo" / f"{entry.name}-1")]
    with pytest.raises(SystemExit) as refused:
        main(["zoo", "build", entry.name, "--out", str(zoo.ZOO_DIR)])
    assert refused.value.code == 2 and "shipped catalog" in capsys.readouterr().err and len(calls) == 1
    assert main(["zoo", "build", entry.name, "--out", str(zoo.ZOO_DIR), "--overwrite"]) == 0
    assert calls[-1] == str(zoo.ZOO_DIR)


class Dripping(http.server.BaseHTTPRequestHandler):
    """A mirror that announces 100 kB and then sends one byte every 50 ms."""

    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Length", "100000")
        self.end_headers()
        try:
            for _ in range(100):
                self.wfile.write(b"x")
                self.wfile.flush()
                time.sleep(0.05)
        except OSError:
            pass

    def log_message(self, *args):
        pass


def test_a_stalled_mirror_times_out_and_leaves_no_partial_file(tmp_path, monkeypatch):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Dripping)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setattr(hub, "_TIMEOUT_S", 0.5)
    try:
        start = time.monotonic()
        with pytest.raises(zoo.DownloadError, match="stalled"):
            hub._fetch(f"http://127.0.0.1:{server.server_address[1]}/w.pth", tmp_path / "w.pth", "0" * 64)
        assert time.monotonic() - start < 4
    finally:
        server.shutdown()
    assert list(tmp_path.iterdir()) == []


def test_ctrl_c_during_a_download_leaves_no_partial_file_and_a_killed_one_is_swept(tmp_path, monkeypatch):
    def interrupted(url, stream, max_bytes, deadline):
        stream.write(b"half")
        raise KeyboardInterrupt

    stale = tmp_path / ".w.pth.abc.part"  # what a SIGKILLed download left, long ago
    stale.write_bytes(b"")
    os.utime(stale, (0, 0))
    monkeypatch.setattr(hub, "_copy", interrupted)
    with pytest.raises(KeyboardInterrupt):
        hub._fetch("file:///nowhere", tmp_path / "w.pth", "0" * 64)
    assert list(tmp_path.iterdir()) == []


def test_old_spellings_work_and_warn_once(workdir, capsys):
    argv = ["certify", "--ckpt", CLASSIFIER, "--batch-size", "10", "--batch-size", "10", *SMALL]
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert err.count("warning: --ckpt is deprecated, use --ckpt_path") == 1
    assert err.count("warning: --batch-size is deprecated, use --batch_size") == 1


@pytest.mark.parametrize("command", ["certify", "attack", "audit"])
def test_every_evaluation_command_takes_the_same_spellings_and_wandb_flags(command, capsys):
    with pytest.raises(SystemExit):
        main([command, "--help"])
    help_text = capsys.readouterr().out
    for flag in ("--ckpt_path", "--data.data_dir", "--batch_size", "--seed", "--out", "--overwrite", "--wandb.project",
                 "--wandb.entity", "--wandb.group"):  # fmt: skip
        assert flag in help_text, flag
    assert "--batch-size" not in help_text and "--ckpt " not in help_text  # deprecated spellings are not advertised


def test_wandb_online_without_an_api_key_is_one_line_before_any_work(workdir, monkeypatch, capsys):
    monkeypatch.setenv("WANDB_MODE", "online")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("NETRC", str(workdir / "no-netrc"))
    monkeypatch.setenv("HOME", str(workdir))
    argv = ["certify", "--ckpt_path", CLASSIFIER, *[flag for flag in SMALL if flag != "--no-wandb"]]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("dprobust: error: WANDB_MODE=online but no W&B API key") and "\n" not in err
    assert not (workdir / "runs").exists()


def test_data_names_match_the_data_modules():
    from lightning_dprobust.data import DATAMODULES

    assert tuple(sorted(DATAMODULES)) == DATA_NAMES


@pytest.mark.parametrize("args", [["--help"], ["--version"], ["zoo", "list"], ["zoo", "info", CLASSIFIER]])
def test_help_version_and_zoo_listing_import_neither_torch_nor_lightning(args):
    code = (
        "import sys; from lightning_dprobust.cli import main; code = main(sys.argv[1:]); "
        "heavy = sorted({'torch', 'lightning'} & set(sys.modules)); print('HEAVY', heavy); sys.exit(code)"
    )
    result = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "HEAVY []" in result.stdout


def test_version_prints_the_package_version(capsys):
    from lightning_dprobust import __version__

    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"dprobust {__version__}"


def test_ctrl_c_in_any_other_command_is_one_line_and_exit_130(workdir, monkeypatch, capsys):
    from lightning_dprobust.robustness import attacks

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(attacks, "robust_accuracy", interrupted)
    assert main(["attack", "--ckpt_path", CLASSIFIER, "--max_examples", "4", "--no-wandb", "--device", "cpu"]) == 130
    err = capsys.readouterr().err.strip()
    assert err.startswith("dprobust: interrupted (Ctrl-C)") and "\n" not in err and "Traceback" not in err


SHIPPED_DPSGD = Path(__file__).resolve().parents[2] / "configs" / "dpsgd" / "digits.yaml"


def test_fit_with_an_online_wandb_logger_and_no_api_key_is_one_line(workdir, monkeypatch, capsys):
    monkeypatch.setenv("WANDB_MODE", "online")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("NETRC", str(workdir / "no-netrc"))
    monkeypatch.setenv("HOME", str(workdir))
    assert main(["fit", "--config", str(SHIPPED_DPSGD), "--wandb.project", "mine"]) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("dprobust: error:")]
    assert len(errors) == 1 and errors[0].startswith("dprobust: error: WANDB_MODE=online but no W&B API key")
    assert not (workdir / "runs").exists()


def test_wandb_flags_without_a_wandb_logger_are_refused(workdir, capsys):
    argv = ["fit", "--config", str(SHIPPED_DPSGD), "--trainer.logger", "false", "--wandb.group", "g"]
    assert main(argv) == 2
    assert "--wandb.group: this run has no W&B logger" in capsys.readouterr().err


@pytest.mark.parametrize("extra", [[], ["--method", "pixeldp"]])
def test_certify_without_a_checkpoint_is_one_line(extra, capsys):
    assert main(["certify", "--no-wandb", *extra]) == 2
    assert capsys.readouterr().err.strip() == (
        "dprobust: error: dprobust certify: --ckpt_path is required (a .ckpt or a zoo name; repeat for several)"
    )
