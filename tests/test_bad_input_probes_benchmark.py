"""benchmarks/bad_input_probes.py: each outcome lands in its class (data loss before hang before traceback before
silent), and two of its probes run against today's source end in one clear line."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
try:
    import bad_input_probes as probes
finally:
    sys.path.remove(str(ROOT / "benchmarks"))


@pytest.mark.parametrize(
    ("code", "fields", "kind"),
    [
        ("raise SystemExit(0)", {}, "silent"),
        ("raise SystemExit(0)", {"legit": True}, "works"),
        ("import sys; print('error: the clip norm is wrong'); sys.exit(2)", {"names": "clip norm"}, "clear"),
        ("import sys; print('error: something'); sys.exit(2)", {"names": "clip norm"}, "unclear"),
        ("raise ValueError('clip norm')", {"names": "clip norm"}, "traceback"),
        ("import time; time.sleep(30)", {"timeout_s": 1.0}, "hang"),
        ("import os; os.remove('kept.txt')", {"names": "x"}, "data loss"),
        ("import time; time.sleep(60)", {"interrupt_after_s": 5.0, "names": "interrupt"}, "traceback"),  # after startup
    ],
    ids=["silent", "works", "clear", "unclear", "traceback", "hang", "data-loss", "ctrl-c-traceback"],
)
def test_each_outcome_lands_in_its_class(code, fields, kind, tmp_path):
    def commands(setting):  # one process running ``code`` in the probe's fresh folder, which holds kept.txt
        (setting.folder / "kept.txt").write_text("mine")
        return [["python", code]]

    probe = probes.Probe("p", "", commands, protect=lambda s: [s.folder / "kept.txt"], **fields)
    (tmp_path / "src").mkdir()
    assert probes.run_probe(probe, tmp_path / "src", tmp_path, tmp_path).kind == kind


def test_every_probe_has_a_unique_id_and_a_way_to_be_judged():
    ids = [probe.id for probe in probes.PROBES]
    assert len(ids) == len(set(ids))
    assert all(probe.legit or probe.names for probe in probes.PROBES)


def test_two_probes_against_todays_source_end_in_one_clear_line(tmp_path):
    """A bad config value and a bad Python argument, as a user would meet them: a process each, status 2, one line
    that names the problem (no traceback)."""
    src = probes.copy_source(ROOT, tmp_path / "src")
    chosen = [probe for probe in probes.PROBES if probe.id in ("duplicated-yaml-key", "clip-norm-true")]
    finished = tmp_path / "finished"  # neither probe reads the finished run
    for probe in chosen:
        outcome = probes.run_probe(probe, src, finished, tmp_path)
        assert (outcome.kind, outcome.status) == ("clear", 2), outcome.details["tail"]
