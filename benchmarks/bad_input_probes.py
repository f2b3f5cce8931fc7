"""The bad-input probes of docs/bad_inputs.md run against two versions of the library: what each does with each input.

``tests/test_bad_inputs.py`` holds today's library to one clear line per bad input, in-process, with today's API. This
script instead runs each probe as a user would, one ``dprobust`` process (or, for the Python API's probes, one
``python`` process) per probe in a fresh folder, against a copy of the library's source tree, so it can run the same
probes against an older commit (``--before DIR``: a checkout of that commit, e.g. ``git archive 6ad82a0 | tar -x -C
DIR``) and count both versions' outcomes by class. The probes use the spellings both versions accept (today's CLI keeps
the older flags as deprecated aliases) and build their configs from each version's own recipes plus an override file.

Each outcome is classified, in this order of precedence:

* ``data loss``: a file the probe protects changed or vanished (the release, the shipped zoo, an earlier run's output);
* ``hang``: the process did not end within the probe's time limit;
* ``traceback``: the output holds a Python traceback;
* ``silent``: a bad input ran to the end (exit status 0);
* ``clear``: the process stopped with a non-zero status and its error text names the problem (the probe's ``names``,
  a regular expression in words both versions would use);
* ``unclear``: it stopped without a traceback, but the error does not name the problem (or a legitimate use failed);
* ``works``: a legitimate use (marked ``legit``) ended with status 0, harming nothing.

Usage: ``python benchmarks/bad_input_probes.py [--before DIR] [--only ID ...]`` (from the repository root).
"""

from __future__ import annotations

import argparse
import hashlib
import http.server
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
import yaml
from PIL import Image
from versions import copy_source, dprobust_command, isolated_environment

from results import add_results_arguments, result_name, write_result

ROOT = Path(__file__).resolve().parents[1]
CLASSES = ("clear", "works", "unclear", "traceback", "silent", "hang", "data loss")
DPSGD_CONFIG = "configs/dpsgd/digits.yaml"
QUIET = ["--trainer.logger", "false", "--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary",
         "false", "--trainer.limit_val_batches", "0", "--trainer.num_sanity_val_steps", "0"]  # fmt: skip
LAST = Path("runs/dpsgd-digits/checkpoints/last.ckpt")
SYNTHESIZER, DENOISER = "igamt.dp_synthetic_ehr_s10", "dncnn_gn.transdenoiser_digits_eps1_s025"


@dataclass
class Setting:
    """Where a probe runs: ``src`` (the copied source tree), ``folder`` (the probe's own, fresh), ``finished`` (a
    folder where ``dprobust fit`` of the DP-SGD digits recipe ran for one epoch, shared read-only), ``env`` (the
    processes' environment)."""

    src: Path
    folder: Path
    finished: Path
    env: dict[str, str]

    def override(self, text: str) -> str:
        """``text`` written as the folder's ``override.yaml``; its path."""
        path = self.folder / "override.yaml"
        path.write_text(text)
        return str(path)

    def copy_of_last(self, edit: Callable[[dict], None] | None = None) -> str:
        """The finished run's last checkpoint copied into the folder, ``edit`` applied to it."""
        path = self.folder / "copy.ckpt"
        shutil.copy(self.finished / LAST, path)
        if edit is not None:
            checkpoint = torch.load(path, weights_only=False)
            edit(checkpoint)
            torch.save(checkpoint, path)
        return str(path)

    def release(self) -> str:
        """The zoo's IGAMT synthesizer saved by the version's own ``ReleasedSynthesizer.save`` as ``release.pt``."""
        path = self.folder / "release.pt"
        code = f"from lightning_dprobust import zoo; zoo.load({SYNTHESIZER!r}).save({str(path)!r})"
        subprocess.run([sys.executable, "-c", code], cwd=self.folder, env=self.env, check=True, capture_output=True)
        return str(path)


Commands = Callable[[Setting], list[list[str]]]
"""The argument lists of a probe's processes, run in turn; ``["python", CODE]`` runs Python code, else ``dprobust``."""


@dataclass(frozen=True)
class Probe:
    """One input: ``commands`` builds its processes in the probe's folder; ``names`` (a regex, case-insensitive) is
    what a clear error line must contain; ``legit`` marks a legitimate use (status 0 is then ``works``, not
    ``silent``); ``protect`` lists the files no process may change; ``interrupt_after_s`` sends Ctrl-C (SIGINT) that
    long after each of its processes starts; ``timeout_s`` is the limit past which it counts as a hang;
    ``variables`` are set in the processes' environment."""

    id: str
    case: str
    commands: Commands
    names: str = ""
    legit: bool = False
    protect: Callable[[Setting], list[Path]] = lambda s: []
    interrupt_after_s: float | None = None
    timeout_s: float = 300.0
    variables: dict[str, str] = field(default_factory=dict)


@dataclass
class Outcome:
    """What a probe did: its class (:data:`CLASSES`), the last process's exit status (None: killed at the limit), its
    last error line, the seconds of all its processes, and ``details`` (the files it changed, its output's tail)."""

    kind: str
    status: int | None
    message: str
    seconds: float
    details: dict = field(default_factory=dict)


def fit(*flags: str, config: str = DPSGD_CONFIG) -> Commands:
    return lambda s: [["fit", "--config", str(s.src / config), *QUIET, "--trainer.max_steps", "2", *flags]]


def resume_with(edit: Callable[[dict], None] | None, *flags: str, config: str = DPSGD_CONFIG) -> Commands:
    return lambda s: [["fit", "--config", str(s.src / config), *QUIET, "--trainer.max_steps", "8", *flags,
                       "--ckpt_path", s.copy_of_last(edit)]]  # fmt: skip


def nan_weight(checkpoint: dict) -> None:
    next(value for value in checkpoint["state_dict"].values() if value.is_floating_point())[0] = float("nan")


def foreign_hyperparameter(checkpoint: dict) -> None:
    checkpoint["hyper_parameters"]["bogus"] = 3


def python(code: str) -> Commands:
    """Python code against the library's API; an exception ends the process with status 2 and its message."""
    wrapped = f"import sys\ntry:\n{_indent(code)}\nexcept Exception as error:\n" \
              f"    print(f'error: {{type(error).__name__}}: {{error}}', file=sys.stderr); sys.exit(2)\n"  # fmt: skip
    return lambda s: [["python", wrapped]]


def _indent(code: str) -> str:
    return "\n".join("    " + line for line in code.strip().splitlines())


API_FITS = """
import lightning as L
from lightning_dprobust.callbacks import DPCallback
from lightning_dprobust.data import DigitsDataModule
from lightning_dprobust.methods import DPSGD
{callback}
for _ in range({fits}):
    trainer = L.Trainer(max_steps=2, callbacks=[callback], logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, accelerator="cpu",
                        use_distributed_sampler=False, limit_val_batches=0, num_sanity_val_steps=0)
    trainer.fit(DPSGD(model="mlp_tanh", lr=0.02), DigitsDataModule(batch_size=128))
"""


def api_fit(callback: str, fits: int = 1) -> Commands:
    return python(API_FITS.format(callback=callback, fits=fits))


def ehr_csv(value: str) -> Commands:
    """A two-step IGAMT fit (each version's recipe) on a long-format EHR CSV whose one measurement is ``value``."""

    def commands(s: Setting) -> list[list[str]]:
        rows = [f"p{i},{t},hr,{value if (i, t) == (3, 1) else 70 + t},{30 + i}" for i in range(40) for t in range(3)]
        (s.folder / "ehr.csv").write_text("patient,time,feature,value,age\n" + "\n".join(rows) + "\n")
        override = {
            "model": {"init_args": {"num_features": 2, "static_continuous": 1, "static_groups": [], "max_steps": 3}},
            "data": {"init_args": {"source": "csv", "csv_path": str(s.folder / "ehr.csv"), "num_steps": 3,
                                   "batch_size": 8, "ranges": {"time_increment": [0, 2], "hr": [0, 200],
                                                                "age": [0, 100]}}},
        }  # fmt: skip
        config = s.override(yaml.safe_dump(override))
        return [["fit", "--config", str(s.src / "configs/igamt/synthetic.yaml"), "--config", config, *QUIET,
                 "--trainer.max_steps", "2"]]  # fmt: skip

    return commands


def idc_without_positives(s: Setting) -> list[list[str]]:
    """IDC in its official layout (``<patient>/<label>/*.png``, 50x50), every patient without its ``1/`` folder."""
    for patient in range(8):
        for index in range(4):
            path = s.folder / "idc" / str(patient) / "0" / f"{patient}_idx5_x{50 * index}_y0_class0.png"
            path.parent.mkdir(parents=True, exist_ok=True)
            Image.new("RGB", (50, 50), (40 * index, 100, 20 * patient)).save(path)
    return fit("--data", "lightning_dprobust.data.IDCDataModule", "--data.init_args.data_dir", str(s.folder / "idc"),
               "--data.init_args.batch_size", "8", "--data.init_args.train_size", "0.4",
               "--data.init_args.test_size", "0.25")(s)  # fmt: skip


class DrippingMirror(http.server.BaseHTTPRequestHandler):
    """A zoo mirror that announces a 4 KiB file and sends one byte of it every 20 s."""

    def do_GET(self) -> None:  # noqa: N802 (the http.server name)
        self.send_response(200)
        self.send_header("Content-Length", "4096")
        self.end_headers()
        try:
            for _ in range(4096):
                self.wfile.write(b"\0")
                self.wfile.flush()
                time.sleep(20)
        except OSError:  # the client gave up
            pass

    def log_message(self, *args) -> None:
        pass


def download_from_a_dripping_mirror(s: Setting) -> list[list[str]]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), DrippingMirror)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    s.env["DPROBUST_ZOO_URL"] = f"http://127.0.0.1:{server.server_address[1]}"
    return [["zoo", "download", "mlp_tanh.erm_digits"]]


def certify(checkpoint: str, *flags: str, n: int = 100, examples: int = 4) -> list[str]:
    return ["certify", "--ckpt_path", checkpoint, "--n0", "10", "--n", str(n), "--max-examples", str(examples),
            "--no-wandb", "--no-progress", *flags]  # fmt: skip


def two_certify_runs(s: Setting) -> list[list[str]]:
    for name in ("a", "b"):
        (s.folder / name).mkdir()
        shutil.copy(s.finished / LAST, s.folder / name / "last.ckpt")
    return [certify(str(s.folder / name / "last.ckpt")) for name in ("a", "b")]


def first_certify_output(s: Setting) -> list[Path]:
    """What the first of two ``certify`` runs wrote, read after it ended (see :func:`run_probe`)."""
    return [path for path in (s.folder / "runs").rglob("*") if path.is_file()] if (s.folder / "runs").exists() else []


def zoo_files(s: Setting) -> list[Path]:
    return sorted(path for path in (s.src / "zoo").rglob("*") if path.is_file())


def fit_then_synthesize(s: Setting) -> list[list[str]]:
    train = ["fit", "--config", str(s.src / "configs/igamt/synthetic.yaml"), *QUIET, "--trainer.max_steps", "2",
             "--trainer.default_root_dir", str(s.folder / "igamt")]  # fmt: skip
    checkpoint = s.folder / "igamt" / "checkpoints" / "last.ckpt"
    return [train, ["synthesize", "--ckpt", str(checkpoint), "--n", "4", "--out", str(s.folder / "synthetic.csv")]]


PROBES = [
    # data loss
    Probe("zoo-build-without-out", "`zoo build` of a shipped entry without --out",
          lambda s: [["zoo", "build", "mlp_tanh.dpsgd_digits_eps1", "--epochs", "1"]], r"catalog|--out|overwrite",
          legit=True, protect=zoo_files, timeout_s=600),
    Probe("synthesize-out-is-the-release", "`synthesize --out` equal to its release file",
          lambda s: [["synthesize", "--ckpt", s.release(), "--n", "2", "--out", str(s.folder / "release.pt")]],
          r"release|--out|overwrite", legit=True, protect=lambda s: [s.folder / "release.pt"]),
    Probe("certify-twice-into-one-folder", "a second `certify` of another `last.ckpt`", two_certify_runs,
          r"--out|overwrite|exists", legit=True, protect=first_certify_output),
    # silent swaps
    Probe("resume-checkpoint-of-another-method", "a DP-CERT config resumed from a DP-SGD checkpoint",
          resume_with(None, config="configs/dpcert/digits.yaml"), r"DPSGD.*DPCert|DPCert.*DPSGD|method"),
    Probe("resume-with-another-lr", "a resume that changes the learning rate", resume_with(None, "--model.init_args.lr",
          "0.1"), r"lr"),
    Probe("resume-on-another-dataset-size", "a resume on a subset of the training set",
          resume_with(None, "--data.init_args.train_part", "private"), r"examples|dataset|data"),
    Probe("certify-denoiser-at-another-sigma", "`certify --denoiser` at a sigma the denoiser was not trained at",
          lambda s: [certify("mlp_tanh.erm_digits_public", "--denoiser", DENOISER, "--sigma", "0.5")], r"sigma"),
    Probe("certify-denoiser-with-another-classifier", "`certify --denoiser` with a classifier it was not trained for",
          lambda s: [certify("mlp_tanh.erm_digits", "--denoiser", DENOISER)], r"classifier"),
    # logging
    Probe("wandb-online-without-key", "`fit` logging to W&B online without an API key",
          lambda s: [["fit", "--config", str(s.src / DPSGD_CONFIG), "--trainer.max_steps", "2",
                      "--trainer.enable_progress_bar", "false"]], r"W&B|wandb|WANDB_API_KEY|API key", timeout_s=180,
          variables={"WANDB_MODE": "online"}),  # fmt: skip
    Probe("zoo-download-from-a-dripping-mirror", "`zoo download` from a mirror that sends one byte every 20 s",
          download_from_a_dripping_mirror, r"timed? ?out|stalled|took longer", timeout_s=240),
    # the synthesizer's documented path
    Probe("synthesize-from-a-fit-checkpoint", "`fit` of IGAMT, then `synthesize` of its checkpoint",
          fit_then_synthesize, legit=True),
    Probe("synthesize-from-a-zoo-name", "`synthesize` of the zoo's IGAMT synthesizer by name",
          lambda s: [["synthesize", "--ckpt", SYNTHESIZER, "--n", "4", "--out", str(s.folder / "s.csv")]], legit=True),
    # tracebacks the review met
    Probe("transdenoiser-classifier-of-another-dataset", "TransDenoiser with an MNIST classifier on digits",
          fit("--model.init_args.classifier", "cnn_tanh.erm_mnist5k", config="configs/transdenoiser/digits.yaml"),
          r"shape|classifier"),
    Probe("ain-target-of-another-dataset", "AIN with an MNIST target on digits",
          fit("--model.init_args.target", "cnn_tanh.erm_mnist5k", config="configs/ain/digits.yaml"), r"shape|target"),
    Probe("ehr-csv-nan-value", "an EHR CSV with a NaN measurement", ehr_csv("NaN"), r"NaN|finite"),
    Probe("ehr-csv-infinite-value", "an EHR CSV with an infinite measurement", ehr_csv("inf"), r"inf|finite"),
    Probe("synthesize-truncated-release", "`synthesize` of a release cut in half",
          lambda s: [["synthesize", "--ckpt", _truncated(s.release()), "--n", "2", "--out", str(s.folder / "s.csv")]],
          r"truncated|damaged|corrupt"),
    Probe("certify-interrupted", "Ctrl-C during a long `certify`",
          lambda s: [certify(str(s.finished / LAST), n=1_000_000, examples=500)], r"interrupt",
          interrupt_after_s=40.0),
    Probe("idc-class-absent", "an IDC folder without one of its two classes", idc_without_positives,
          r"class 1|positive|absent|no patch"),
    Probe("resume-nan-weights", "a resume from a checkpoint whose weights hold NaN", resume_with(nan_weight),
          r"non-finite|NaN|nan"),
    Probe("resume-foreign-hyperparameters", "a resume from a checkpoint with a hyperparameter the method lacks",
          resume_with(foreign_hyperparameter), r"bogus"),
    Probe("certify-foreign-hyperparameters", "`certify` of a checkpoint with a hyperparameter the method lacks",
          lambda s: [certify(s.copy_of_last(foreign_hyperparameter))], r"bogus"),
    # silently ignored values
    Probe("duplicated-yaml-key", "a config file that sets one key twice",
          lambda s: fit("--config", s.override("seed_everything: 1\nseed_everything: 2\n"))(s),
          r"seed_everything.*twice|duplicate"),
    Probe("poisson-sampling-as-a-word", "`poisson_sampling: \"no\"` in the dp group",
          lambda s: fit("--config", s.override('dp:\n  poisson_sampling: "no"\n'))(s), r"poisson_sampling"),
    Probe("linked-num-classes-override", "`--model.init_args.num_classes 5` that the data module overrides",
          fit("--model.init_args.num_classes", "5"), r"num_classes"),
    Probe("audit-target-epsilon-without-dp", "`audit --no-dp --target-epsilon 1`",
          lambda s: [["audit", "--config", str(s.src / DPSGD_CONFIG), "--canaries", "10", "--epochs", "1", "--no-dp",
                      "--target-epsilon", "1"]], r"target.epsilon.*no.dp|no.dp.*target.epsilon"),  # fmt: skip
    Probe("synthesize-zero-steps", "`synthesize --steps 0`",
          lambda s: [["synthesize", "--ckpt", s.release(), "--steps", "0", "--n", "2", "--out",
                      str(s.folder / "s.csv")]], r"--steps"),
    Probe("clip-norm-true", "`DPCallback(max_grad_norm=True)`",
          api_fit("callback = DPCallback(max_grad_norm=True, noise_multiplier=1.0)"), r"max_grad_norm"),
    Probe("poisson-sampling-string", "`DPCallback(poisson_sampling=\"no\")`",
          api_fit("callback = DPCallback(max_grad_norm=1.0, noise_multiplier=1.0, poisson_sampling='no')"),
          r"poisson_sampling"),
    Probe("reused-dp-callback", "one `DPCallback` reused for a second, fresh model",
          api_fit("callback = DPCallback(max_grad_norm=1.0, noise_multiplier=1.0)", fits=2),
          r"another model|fresh|already|reuse"),
    # the documented catalogue, a sample
    Probe("noise-negative", "`--dp.noise_multiplier -1`", fit("--dp.target_epsilon", "null", "--dp.noise_multiplier",
          "-1"), r"noise_multiplier"),
    Probe("clip-zero", "`--dp.max_grad_norm 0`", fit("--dp.max_grad_norm", "0"), r"max_grad_norm"),
    Probe("delta-one", "`--dp.delta 1`", fit("--dp.delta", "1.0"), r"delta"),
    Probe("unknown-accountant", "`--dp.accountant moments`", fit("--dp.accountant", "moments"), r"accountant"),
    Probe("unknown-architecture", "`--model.init_args.model no_such_net`",
          fit("--model.init_args.model", "no_such_net"), r"no_such_net"),
    Probe("resume-truncated-checkpoint", "a resume from a checkpoint cut in half",
          lambda s: [resume_with(None)(s)[0][:-1] + [_truncated(s.copy_of_last())]], r"truncated|damaged|corrupt"),
    Probe("certify-negative-sigma", "`certify --sigma -1`",
          lambda s: [certify(str(s.finished / LAST), "--sigma", "-1")], r"--sigma"),
    Probe("mnist-missing", "MNIST requested where it was never downloaded",
          fit("--data", "lightning_dprobust.data.MNISTDataModule", "--data.init_args.data_dir", "nowhere"),
          r"MNIST|nowhere"),
]  # fmt: skip


def _truncated(path: str) -> str:
    data = Path(path).read_bytes()
    Path(path).write_bytes(data[: len(data) // 2])
    return path


def digest(paths: list[Path]) -> dict[str, str]:
    return {str(path): hashlib.sha256(path.read_bytes()).hexdigest() for path in paths if path.is_file()}


def environment(src: Path, folder: Path, probe: Probe) -> dict[str, str]:
    return isolated_environment(src, folder) | probe.variables


def run_process(args: list[str], folder: Path, env: dict[str, str], probe: Probe) -> tuple[int | None, str, float]:
    """One process of a probe: its exit status (None: killed at the time limit), its output and its seconds."""
    command = [sys.executable, "-c", args[1]] if args[0] == "python" else dprobust_command(args)
    start = time.monotonic()
    # A process started in the background (``nohup ... &``, some CI runners) ignores SIGINT, and the processes it
    # starts inherit that, so the Ctrl-C probe would test nothing: they start with Python's own handler instead.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        process = subprocess.Popen(command, cwd=folder, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                   text=True, start_new_session=True)  # fmt: skip
    finally:
        signal.signal(signal.SIGINT, previous)
    try:
        if probe.interrupt_after_s is not None:
            try:
                output, _ = process.communicate(timeout=probe.interrupt_after_s)
                return process.returncode, output, time.monotonic() - start
            except subprocess.TimeoutExpired:
                process.send_signal(signal.SIGINT)
        output, _ = process.communicate(timeout=probe.timeout_s)
        return process.returncode, output, time.monotonic() - start
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        output, _ = process.communicate()
        return None, output, time.monotonic() - start


def run_probe(probe: Probe, src: Path, finished: Path, scratch: Path) -> Outcome:
    """Run ``probe`` in a fresh folder under ``scratch`` and classify what happened (see the module docstring).
    Protected files are read before the last process starts, so a probe of two processes protects what the first
    wrote."""
    folder = Path(tempfile.mkdtemp(prefix=f"{probe.id}-", dir=scratch))
    env = environment(src, folder, probe)
    setting = Setting(src, folder, finished, env)
    commands = probe.commands(setting)
    status, output, seconds, protected = 0, "", 0.0, {}
    for index, args in enumerate(commands):
        if index == len(commands) - 1:
            protected = digest(probe.protect(setting))
        status, output, took = run_process(args, folder, env, probe)
        seconds += took
        if status != 0:
            break
    changed = [path for path, sha in protected.items() if digest([Path(path)]) != {path: sha}]
    text = output.replace(str(folder), "<dir>").replace(str(scratch), "<scratch>").strip()
    lines = [line for line in text.splitlines() if line.strip()]
    message = next((line for line in reversed(lines) if "error" in line.lower()), lines[-1] if lines else "")
    details = {"changed": [os.path.relpath(path, scratch) for path in changed], "tail": text[-1500:]}
    if changed:
        kind = "data loss"
    elif status is None:
        kind = "hang"
    elif "Traceback (most recent call last)" in text:
        kind = "traceback"
    elif status == 0:
        kind = "works" if probe.legit else "silent"
    elif probe.names and re.search(probe.names, message, re.IGNORECASE):
        kind = "clear"
    else:
        kind = "unclear"
    return Outcome(kind, status, message[:300], round(seconds, 1), details)


def finished_run(src: Path, scratch: Path) -> Path:
    """A folder where ``dprobust fit`` of the DP-SGD digits recipe ran one epoch (the probes' checkpoint)."""
    folder = scratch / "finished"
    folder.mkdir()
    probe = Probe("finished", "", lambda s: [])
    args = ["fit", "--config", str(src / DPSGD_CONFIG), *QUIET, "--trainer.max_epochs", "1"]
    status, output, _ = run_process(args, folder, environment(src, folder, probe), probe)
    if status != 0 or not (folder / LAST).is_file():
        raise SystemExit(f"the probes' base run failed in {folder} (status {status}):\n{output[-3000:]}")
    return folder


def run_version(source: Path, probes: list[Probe], label: str) -> dict[str, Outcome]:
    scratch = Path(tempfile.mkdtemp(prefix=f"probes-{label}-"))
    try:
        src = copy_source(source, scratch / "src")
        finished = finished_run(src, scratch)
        outcomes = {}
        for probe in probes:
            outcomes[probe.id] = run_probe(probe, src, finished, scratch)
            print(f"{label:6s} {probe.id:45s} {outcomes[probe.id].kind:9s} {outcomes[probe.id].message[:110]}",
                  flush=True)  # fmt: skip
        return outcomes
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, help="a checkout of an older commit to probe too (its source tree)")
    parser.add_argument("--before-label", default="before", help="its name in the tables (e.g. its commit)")
    parser.add_argument("--only", nargs="+", metavar="ID", help="run only these probes")
    add_results_arguments(parser)
    args = parser.parse_args()
    unknown = set(args.only or ()) - {probe.id for probe in PROBES}
    if unknown:
        parser.error(f"--only: no probe named {sorted(unknown)}; the probes are {[probe.id for probe in PROBES]}")
    probes = [probe for probe in PROBES if not args.only or probe.id in args.only]
    versions = {"today": ROOT} | ({args.before_label: args.before} if args.before else {})
    outcomes = {label: run_version(source, probes, label) for label, source in versions.items()}
    labels = list(versions)[::-1]  # the older version first
    rows = [[f"`{probe.id}`", probe.case, *(outcomes[label][probe.id].kind for label in labels),
             outcomes["today"][probe.id].message.replace("|", "/")[:160]] for probe in probes]  # fmt: skip
    totals = [[kind, *(sum(outcome.kind == kind for outcome in outcomes[label].values()) for label in labels)]
              for kind in CLASSES]  # fmt: skip
    for label in labels:
        print(label, dict(Counter(outcome.kind for outcome in outcomes[label].values())))
    notes = (
        f"{len(probes)} probes, one process per probe (two for the synthesize-after-fit and certify-twice probes) in a "
        "fresh folder, against a copy of each version's source tree; classes as in the script's docstring"
    )
    raw = {label: {probe_id: vars(outcome) for probe_id, outcome in found.items()} for label, found in outcomes.items()}
    name = result_name(args, "bad_input_probes")
    write_result(name, title="Bad-input probes: what each version does with each input", columns=["probe", "input",
                 *labels, "message (today)"], rows=rows, notes=notes, raw=raw, directory=args.results_dir)  # fmt: skip
    write_result(f"{name}_totals", title="Bad-input probes: outcomes by class", columns=["class", *labels],
                 rows=totals, notes=notes, directory=args.results_dir)  # fmt: skip


if __name__ == "__main__":
    main()
