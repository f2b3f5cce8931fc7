"""How long each paper reproduction kit's smoke mode takes on this machine (docs/reproducing.md).

Runs ``python benchmarks/papers/<kit>.py --smoke`` for each kit in turn, in a fresh process with one thread (the whole
grid on tiny fake data in the real file formats, 2 steps per cell), and records its wall time and its CPU time (user +
system of the child, imports included) and its number of cells (``--list``). Wall time follows the machine's load; CPU
time much less so.

Usage: ``python benchmarks/paper_kit_times.py [--kits dpcert dpadv stobatch residual thesis]``
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

from results import add_results_arguments, result_name, write_result

PAPERS = Path(__file__).resolve().parent / "papers"
KITS = ("dpcert", "dpadv", "stobatch", "residual", "thesis")


def _children_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def cell_count(kit: str) -> int:
    """Cells of the kit's grid (every table of the kit): the lines of ``--list``."""
    listed = subprocess.run(
        [sys.executable, str(PAPERS / f"{kit}.py"), "--list"], capture_output=True, text=True, check=True
    )
    return sum(1 for line in listed.stdout.splitlines() if line.count(" | ") == 3)


def smoke_seconds(kit: str) -> tuple[float, float]:
    """(wall, CPU) seconds of one smoke run of ``kit``; a failed run stops with its stderr."""
    env = dict(os.environ, OMP_NUM_THREADS="1", WANDB_MODE="offline")
    cpu, start = _children_cpu_seconds(), time.perf_counter()
    done = subprocess.run(
        [sys.executable, str(PAPERS / f"{kit}.py"), "--smoke"], capture_output=True, text=True, env=env
    )
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{kit} --smoke failed (exit {done.returncode}):\n{done.stderr[-2000:]}")
    return wall, _children_cpu_seconds() - cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kits", nargs="+", default=list(KITS), choices=KITS)
    add_results_arguments(parser)
    args = parser.parse_args()
    rows, raw = [], {}
    for kit in args.kits:
        cells = cell_count(kit)
        wall, cpu = smoke_seconds(kit)
        rows.append([f"`{kit}.py`", str(cells), f"{wall:.0f}", f"{cpu:.0f}"])
        raw[kit] = {"cells": cells, "wall s": wall, "cpu s": cpu}
        print(f"{kit}: {cells} cells, smoke {wall:.0f} s wall, {cpu:.0f} s CPU", flush=True)
    load = os.getloadavg()[0]
    write_result(
        result_name(args, "paper_kit_smoke_times"),
        title="Each paper kit's smoke run on this machine: the whole grid on fake data, 2 steps per cell",
        columns=["kit", "cells", "smoke wall s", "smoke CPU s"],
        rows=rows,
        notes="one run of `python benchmarks/papers/<kit>.py --smoke` per kit, in turn, one thread; CPU: user + "
        f"system of the child, about 5 s of imports included; load average at the end {load:.1f}",
        raw=raw,
        directory=args.results_dir,
    )


if __name__ == "__main__":
    main()
