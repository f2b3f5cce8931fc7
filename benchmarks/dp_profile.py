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

import torch
from dp_overhead import CASES, MODES, build_step
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

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


def profile_steps(step, steps: int, device: str, top: int) -> tuple[float, float, str]:
    """``(busy ms per step, kernel launches per step, table of the top operators)`` over ``steps`` steps."""
    cuda = device.startswith("cuda")
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as profiler:
        for _ in range(steps):
            step()
        if cuda:
            torch.cuda.synchronize()
    events = profiler.key_averages()
    key = "self_device_time_total" if cuda else "self_cpu_time_total"
    busy = busy_ms(events, cuda) / steps
    launches = sum(event.count for event in events if event.key.startswith("cudaLaunchKernel")) / steps
    return busy, launches, events.table(sort_by=key, row_limit=top, max_name_column_width=60)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", default="resnet18/b64", choices=list(CASES))
    parser.add_argument("--modes", nargs="+", default=["non-DP", "ghost"], choices=list(MODES))
    parser.add_argument("--steps", type=int, default=20, help="timed steps per mode (median taken)")
    parser.add_argument("--profile-steps", type=int, default=5)
    parser.add_argument("--top", type=int, default=12, help="operators listed per DP mode")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--cudnn-tf32", choices=["on", "off"], default="on", help="non-private steps' cuDNN TF32")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    torch.backends.cudnn.allow_tf32 = args.cudnn_tf32 == "on"
    print(f"{args.case} on {args.device}, threads: {torch.get_num_threads()}, cuDNN TF32: {args.cudnn_tf32}")
    for mode in args.modes:
        step = build_step(args.case, mode, args.device)
        wall = wall_ms(step, args.steps, args.device)
        busy, launches, table = profile_steps(step, args.profile_steps, args.device, args.top)
        counted = f", {launches:.0f} kernel launches/step" if args.device.startswith("cuda") else ""
        print(f"{mode}: {wall:.1f} ms/step wall, {busy:.1f} ms/step busy{counted}")
        if mode != "non-DP":
            print(table)


if __name__ == "__main__":
    main()
