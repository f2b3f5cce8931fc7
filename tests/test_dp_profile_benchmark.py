"""benchmarks/dp_profile.py: per-mode wall and busy time and the costliest operators of the private step."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

# benchmarks/ is a folder of scripts that import their sibling `dp_overhead` by name: load the script by path
_BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(_BENCHMARKS))
_SPEC = importlib.util.spec_from_file_location("dprobust_benchmark_dp_profile", _BENCHMARKS / "dp_profile.py")
bench = importlib.util.module_from_spec(_SPEC)
sys.modules[_SPEC.name] = bench
_SPEC.loader.exec_module(bench)
sys.path.remove(str(_BENCHMARKS))


def test_prints_each_mode_and_the_private_steps_operators(monkeypatch, capsys):
    argv = ["dp_profile.py", "--case", "cnn_tanh/b64", "--steps", "1", "--profile-steps", "1", "--top", "3"]
    monkeypatch.setattr(sys, "argv", argv + ["--device", "cpu"])
    bench.main()
    lines = capsys.readouterr().out.splitlines()
    timings = {line.split(":")[0]: line for line in lines if "ms/step wall" in line}
    assert set(timings) == {"non-DP", "ghost"} and "launches" not in timings["ghost"]
    operators = lines[lines.index(timings["ghost"]) + 1 :]
    assert sum(line.strip().startswith("aten::") for line in operators) == 3  # the table of the ghost step
