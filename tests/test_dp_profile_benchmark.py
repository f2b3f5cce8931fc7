"""benchmarks/dp_profile.py: per-mode wall and busy time and the costliest operators of the private step."""

from __future__ import annotations

import sys

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
