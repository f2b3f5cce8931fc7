"""Where a DP step's time goes: wall time, busy time and kernel launches per step, and the costliest operators.

For one case of ``dp_overhead.py`` and each mode asked for (default ``non-DP`` and ``ghost``), in one process: the
median wall-clock time of ``--steps`` steps after 3 warm-up steps, then ``torch.profiler`` over ``--profile-steps``
steps: the busy time per step (:func:`busy_ms`; CUDA: the time of the kernels and copies on the device, how busy the
GPU was; CPU: the operators' self time), kernel launches per step (CUDA) and the ``--top`` operators by self time. A
CUDA step whose wall time is well above its kernel time waits on kernel launches, not on arithmetic.

Usage: ``python benchmarks/dp_profile.py --case resnet18/b64 [--modes non-DP ghost] [--device cuda] [--cudnn-tf32 off]``
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings
from dataclasses import dataclass

import torch
from dp_overhead import CASES, MODES, build_step
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

from results import add_results_arguments, result_name, slug, write_result

WARM_UP = 3


def wall_ms(step, steps: int, device: str) -> float:
    """Median wall-clock milliseconds of ``steps`` calls of ``step`` after the warm-up."""
    times = []
    for index in range(WARM_UP + steps):
        start = time.perf_counter()
        step()
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        if index >= WARM_UP:
            times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times)


def busy_ms(events, cuda: bool) -> float:
    """Busy milliseconds over all profiled steps. CUDA: the self time of the device's own events (kernels, copies),
    not of the operators that launched them, which report their kernels' time again (summing both counted each
    kernel twice), nor of user annotations such as ``Optimizer.step``. CPU: the self time of every operator."""
    if not cuda:
        return sum(event.self_cpu_time_total for event in events) / 1000
    device = [e for e in events if e.device_type == DeviceType.CUDA and not e.is_user_annotation]
    return sum(event.self_device_time_total for event in device) / 1000


@dataclass(frozen=True)
class Operator:
    """One profiler row averaged over the profiled steps: its name, self milliseconds and calls per step."""

    name: str
    self_ms: float
    calls: float


@dataclass(frozen=True)
class StepProfile:
    """What :func:`profile_steps` measures: busy ms per step, kernel launches per step (0 on CPU) and every
    operator the steps ran, costliest first. The operator *set* follows from the code the step runs; their order and
    times follow from the machine's timing, so only the former is fit for an exact comparison."""

    busy_ms: float
    launches: float
    operators: tuple[Operator, ...]

    @property
    def aten_calls(self) -> float:
        """ATen operator calls per step: the eager step's dispatch count, what a fused or captured step would cut."""
        return sum(operator.calls for operator in self.operators if operator.name.startswith("aten::"))

    def top(self, count: int) -> tuple[Operator, ...]:
        """The ``count`` costliest operators (fewer when the steps ran fewer)."""
        return self.operators[:count]


Measured = tuple[float, StepProfile]
"""A mode's median wall ms per step and its :class:`StepProfile`."""


def profile_steps(step, steps: int, device: str) -> StepProfile:
    """Profile ``steps`` calls of ``step``: busy time (:func:`busy_ms`), kernel launches and operators, per step."""
    cuda = device.startswith("cuda")
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as profiler:
        for _ in range(steps):
            step()
        if cuda:
            torch.cuda.synchronize()
    events = profiler.key_averages()
    key = "self_device_time_total" if cuda else "self_cpu_time_total"
    operators = [Operator(e.key, getattr(e, key) / 1000 / steps, e.count / steps) for e in events]
    operators.sort(key=lambda operator: operator.self_ms, reverse=True)
    launches = sum(event.count for event in events if event.key.startswith("cudaLaunchKernel")) / steps
    return StepProfile(busy_ms(events, cuda) / steps, launches, tuple(operators))


def operator_table(operators: tuple[Operator, ...]) -> str:
    """One line per operator: name, self ms per step and calls per step, under a header line."""
    width = max([len("operator")] + [len(operator.name) for operator in operators])
    lines = [f"  {'operator':<{width}}  self ms/step  calls/step"]
    lines += [f"  {o.name:<{width}}  {o.self_ms:12.3f}  {o.calls:10.1f}" for o in operators]
    return "\n".join(lines)


def mode_line(mode: str, wall: float, profiled: StepProfile, cuda: bool) -> str:
    """``<mode>: <wall> ms/step wall, <busy> ms/step busy[, <n> kernel launches/step]`` (launches on CUDA only)."""
    counted = f", {profiled.launches:.0f} kernel launches/step" if cuda else ""
    return f"{mode}: {wall:.1f} ms/step wall, {profiled.busy_ms:.1f} ms/step busy{counted}"


def measure(case: str, modes: list[str], steps: int, profiled: int, device: str) -> dict[str, Measured]:
    """``mode -> (median wall ms per step over steps, StepProfile over profiled steps)``, in order, in this process."""
    results = {}
    for mode in modes:
        step = build_step(case, mode, device)
        results[mode] = (wall_ms(step, steps, device), profile_steps(step, profiled, device))
    return results


def report(results: dict[str, Measured], top: int, cuda: bool) -> str:
    """Each mode's line (:func:`mode_line`); after each private mode's, the table of its ``top`` operators."""
    lines = []
    for mode, (wall, profiled) in results.items():
        lines.append(mode_line(mode, wall, profiled, cuda))
        if mode != "non-DP":
            lines.append(operator_table(profiled.top(top)))
    return "\n".join(lines)


def write(results: dict[str, Measured], args: argparse.Namespace) -> None:
    """The result file ``dp_profile_<case>_<device>``: one row per mode, its three costliest operators in a cell and
    its ``--top`` operators in ``raw``."""
    cuda = args.device.startswith("cuda")
    header = [
        "mode",
        "wall ms/step",
        "busy ms/step",
        "ATen operators/step",
        "kernel launches/step",
        "costliest operators (self ms/step)",
    ]
    rows = [
        [
            mode,
            f"{wall:.1f}",
            f"{profiled.busy_ms:.1f}",
            f"{profiled.aten_calls:.0f}",
            f"{profiled.launches:.0f}" if cuda else "",
            ", ".join(f"{o.name} {o.self_ms:.3f}" for o in profiled.top(3)),
        ]
        for mode, (wall, profiled) in results.items()
    ]
    raw = {mode: [[o.name, o.self_ms, o.calls] for o in m[1].top(args.top)] for mode, m in results.items()}
    write_result(
        result_name(args, f"dp_profile_{slug(args.case)}_{torch.device(args.device).type}"),
        title=f"Where a DP step's time goes: {args.case} on {args.device}",
        columns=header,
        rows=rows,
        notes=f"one run, one process; wall: median of {args.steps} steps after {WARM_UP} warm-up steps; busy time and "
        f"operators: torch.profiler over {args.profile_steps} steps (CUDA: kernel time; CPU: operators' self time); "
        f"threads {torch.get_num_threads()}, cuDNN TF32 {args.cudnn_tf32}",
        raw={"top_operators (name, self ms/step, calls/step)": raw},
        device=args.device,
        directory=args.results_dir,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", default="resnet18/b64", choices=list(CASES))
    parser.add_argument("--modes", nargs="+", default=["non-DP", "ghost"], choices=list(MODES))
    parser.add_argument("--steps", type=int, default=20, help="timed steps per mode (median taken)")
    parser.add_argument("--profile-steps", type=int, default=5)
    parser.add_argument("--top", type=int, default=12, help="operators listed per DP mode")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--cudnn-tf32", choices=["on", "off"], default="on", help="non-private steps' cuDNN TF32")
    add_results_arguments(parser)
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    torch.backends.cudnn.allow_tf32 = args.cudnn_tf32 == "on"
    print(f"{args.case} on {args.device}, threads: {torch.get_num_threads()}, cuDNN TF32: {args.cudnn_tf32}")
    results = measure(args.case, args.modes, args.steps, args.profile_steps, args.device)
    print(report(results, args.top, args.device.startswith("cuda")))
    write(results, args)


if __name__ == "__main__":
    main()
