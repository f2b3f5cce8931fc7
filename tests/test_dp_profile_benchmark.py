"""benchmarks/dp_profile.py: per-mode wall and busy time and the costliest operators of the private step.

Timings vary from run to run, so these tests check what is measured and how it is reported, never a time."""

from __future__ import annotations

import json
import re
import sys
from types import SimpleNamespace

import pytest
from torch.autograd import DeviceType

from tests.helpers import load_benchmark

bench = load_benchmark("dp_profile")


MODE_LINE = r"(non-DP|ghost): \d+\.\d ms/step wall, \d+\.\d ms/step busy"
OPERATOR_ROW = r"  \S.* +\d+\.\d{3} +\d+\.\d"


def test_prints_each_mode_and_a_table_of_the_private_steps_top_operators(monkeypatch, capsys, tmp_path):
    """The report's format: each mode's line, and under the private mode's a header and ``--top`` operator rows.
    Which operators are the costliest depends on timing, so only the rows' number and shape are checked."""
    argv = ["dp_profile.py", "--case", "cnn_tanh/b64", "--steps", "1", "--profile-steps", "1", "--top", "3"]
    monkeypatch.setattr(sys, "argv", argv + ["--device", "cpu", "--results-dir", str(tmp_path)])
    bench.main()
    title, plain, private, header, *rows = capsys.readouterr().out.splitlines()
    assert title.startswith("cnn_tanh/b64 on cpu, threads: ")
    assert re.fullmatch(MODE_LINE, plain) and plain.startswith("non-DP: ")
    assert re.fullmatch(MODE_LINE, private) and private.startswith("ghost: ")
    assert header.split() == ["operator", "self", "ms/step", "calls/step"]
    assert len(rows) == 3 and all(re.fullmatch(OPERATOR_ROW, row) for row in rows)
    record = json.loads((tmp_path / "dp_profile_cnn_tanh_b64_cpu.json").read_text())
    assert [row[0] for row in record["rows"]] == ["non-DP", "ghost"] and record["columns"][1] == "wall ms/step"


def test_the_profile_holds_every_operator_of_the_private_step_costliest_first():
    """What the profile measures, timing aside: the operators the ghost step runs (its convolutions, matrix products
    and noise), sorted by self time, and on CPU a busy time that is the sum of their self times."""
    profiled = bench.profile_steps(bench.build_step("cnn_tanh/b64", "ghost", "cpu"), 2, "cpu")
    names = {operator.name for operator in profiled.operators}
    assert {"aten::convolution_backward", "aten::addmm", "aten::normal_"} <= names
    times = [operator.self_ms for operator in profiled.operators]
    assert times == sorted(times, reverse=True) and profiled.top(3) == profiled.operators[:3]
    assert profiled.busy_ms == pytest.approx(sum(times)) and profiled.launches == 0
    aten = [operator.calls for operator in profiled.operators if operator.name.startswith("aten::")]
    assert profiled.aten_calls == sum(aten) > 0


def test_report_lists_the_top_operators_of_private_modes_only():
    """The report of fixed measurements, character for character."""
    operators = (bench.Operator("aten::mm", 2.5, 3.0), bench.Operator("aten::add_", 0.25, 10.0))
    profiled = bench.StepProfile(busy_ms=2.75, launches=41.0, operators=operators)
    text = bench.report({"non-DP": (1.0, profiled), "ghost": (3.04, profiled)}, top=1, cuda=True)
    assert text.splitlines() == [
        "non-DP: 1.0 ms/step wall, 2.8 ms/step busy, 41 kernel launches/step",
        "ghost: 3.0 ms/step wall, 2.8 ms/step busy, 41 kernel launches/step",
        "  operator  self ms/step  calls/step",
        "  aten::mm         2.500         3.0",
    ]


def test_cuda_busy_time_counts_each_kernel_once():
    """An operator reports its kernels' device time as its own self time too: the busy time counts the kernel events
    alone, and no user annotation (e.g. ``Optimizer.step``), whose time its kernels already count."""

    def event(device, microseconds, annotation=False):
        return SimpleNamespace(
            device_type=device,
            self_device_time_total=microseconds,
            self_cpu_time_total=5.0,
            is_user_annotation=annotation,
        )

    events = [
        event(DeviceType.CPU, 3000.0),  # aten::bmm, its kernel's time reported again
        event(DeviceType.CUDA, 3000.0),  # the kernel
        event(DeviceType.CUDA, 1000.0),  # a copy
        event(DeviceType.CUDA, 4000.0, annotation=True),  # Optimizer.step#SGD.step
    ]
    assert bench.busy_ms(events, cuda=True) == 4.0
    assert bench.busy_ms(events, cuda=False) == 0.02
