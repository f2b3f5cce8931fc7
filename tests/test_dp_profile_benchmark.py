"""benchmarks/dp_profile.py: per-mode wall and busy time and the costliest operators of the private step."""

from __future__ import annotations

import sys
from types import SimpleNamespace

from torch.autograd import DeviceType

from tests.helpers import load_benchmark

bench = load_benchmark("dp_profile")


def test_prints_each_mode_and_the_private_steps_operators(monkeypatch, capsys):
    argv = ["dp_profile.py", "--case", "cnn_tanh/b64", "--steps", "1", "--profile-steps", "1", "--top", "3"]
    monkeypatch.setattr(sys, "argv", argv + ["--device", "cpu"])
    bench.main()
    lines = capsys.readouterr().out.splitlines()
    timings = {line.split(":")[0]: line for line in lines if "ms/step wall" in line}
    assert set(timings) == {"non-DP", "ghost"} and "launches" not in timings["ghost"]
    operators = lines[lines.index(timings["ghost"]) + 1 :]
    assert sum(line.strip().startswith("aten::") for line in operators) == 3  # the table of the ghost step


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
