"""Two versions of this library's ghost engine against one non-private step, interleaved in one run.

Each (version, mode) lives in its own worker process that imports ``lightning_dprobust`` from the folder given for
its version (e.g. the working tree and ``git archive <commit> lightning_dprobust | tar -x -C /tmp/old``), and builds
the step of ``dp_overhead.py`` for the case. The parent runs ``--rounds`` rounds, rotating the order of the three
workers each round, so that a slow spell of a shared machine (a GPU host's launch rate varies from minute to
minute) hits every variant alike; each round's ratios are of the medians of ``--steps`` steps, and the report gives
the median ratio over rounds with its min-max.

Usage: ``python benchmarks/engine_versions.py --new . --old /tmp/old --cases resnet18/b64 vit_tiny/b64
[--device cuda] [--rounds 9] [--steps 10]``
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import sys
from pathlib import Path

import torch

from results import add_results_arguments, result_name, write_result

HERE = Path(__file__).resolve().parent
VARIANTS = (("non-DP", "new", "non-DP"), ("new", "new", "ghost"), ("old", "old", "ghost"))
"""(name, version, dp_overhead mode)."""


def _worker(package_root: str, case: str, mode: str, device: str, connection) -> None:
    """Import the library from ``package_root``, build the step, then serve ``steps`` requests with median times."""
    sys.path[:0] = [package_root, str(HERE)]
    import warnings

    warnings.filterwarnings("ignore")
    from dp_overhead import build_step, timed_steps

    import lightning_dprobust

    step = build_step(case, mode, device)
    for _ in range(3):  # warm-up: the ghost engine's first-step check, allocator and kernel caches
        step()
    connection.send(lightning_dprobust.__file__)
    while (steps := connection.recv()) is not None:
        connection.send(statistics.median(timed_steps(step, steps, device)))


def compare(case: str, roots: dict[str, str], device: str, rounds: int, steps: int) -> str:
    """One line: median ms of each variant, and the per-round ratios new / non-DP, old / non-DP and new / old."""
    return line(measure(case, roots, device, rounds, steps))


def measure(case: str, roots: dict[str, str], device: str, rounds: int, steps: int) -> dict:
    """The case's median ms of each variant, the ratios' ``spread`` strings and the library files each one ran."""
    from dp_overhead import spread

    context = mp.get_context("spawn")
    workers = {}
    for name, version, mode in VARIANTS:
        parent, child = context.Pipe()
        process = context.Process(target=_worker, args=(roots[version], case, mode, device, child), daemon=True)
        process.start()
        workers[name] = (process, parent)
    sources = {name: pipe.recv() for name, (_, pipe) in workers.items()}
    times: dict[str, list[float]] = {name: [] for name in workers}
    order = list(workers)
    for r in range(rounds):
        for name in order[r % len(order) :] + order[: r % len(order)]:
            workers[name][1].send(steps)
            times[name].append(workers[name][1].recv())
    for process, pipe in workers.values():
        pipe.send(None)
        process.join()
    ms = {name: 1000 * statistics.median(values) for name, values in times.items()}
    ratio = {
        f"{a} / {b}": spread([x / y for x, y in zip(times[a], times[b], strict=True)])
        for a, b in (("new", "non-DP"), ("old", "non-DP"), ("new", "old"))
    }
    return {"case": case, "sources": sources, "ms": ms, "ratio": ratio, "seconds": times}


HEADER = ["case", "ms non-DP", "ms new", "ms old", "new / non-DP", "old / non-DP", "new / old"]


def cells(measured: dict) -> list[str]:
    """A row of :data:`HEADER`."""
    ms, ratio = measured["ms"], measured["ratio"]
    return [measured["case"], *(f"{ms[name]:.1f}" for name in ("non-DP", "new", "old")), *ratio.values()]


def line(measured: dict) -> str:
    sources, ms, ratio = measured["sources"], measured["ms"], measured["ratio"]
    return (
        f"{measured['case']} ({sources['new']} vs {sources['old']}): ms non-DP {ms['non-DP']:.1f}, new "
        f"{ms['new']:.1f}, old {ms['old']:.1f}; " + ", ".join(f"{pair} {value}" for pair, value in ratio.items())
    )


def main() -> None:
    from dp_overhead import CASES

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--new", required=True, help="folder holding the new version's lightning_dprobust/")
    parser.add_argument("--old", required=True, help="folder holding the old version's lightning_dprobust/")
    parser.add_argument("--cases", nargs="+", default=["resnet18/b64"], choices=list(CASES))
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    add_results_arguments(parser)
    args = parser.parse_args()
    roots = {"new": str(Path(args.new).resolve()), "old": str(Path(args.old).resolve())}
    for version, root in roots.items():
        if not (Path(root) / "lightning_dprobust" / "__init__.py").is_file():
            parser.error(f"--{version} {root} holds no lightning_dprobust/ package")
    measured = []
    for case in args.cases:
        measured.append(measure(case, roots, args.device, args.rounds, args.steps))
        print(line(measured[-1]), flush=True)
    write_result(
        result_name(args, f"engine_versions_{torch.device(args.device).type}"),
        title="Two versions of the ghost engine against one non-private step, interleaved in one run",
        columns=HEADER,
        rows=[cells(m) for m in measured],
        notes=f"one run; new: {args.new}, old: {args.old}; {args.rounds} rounds x {args.steps} steps, order rotating; "
        "ratio: median over rounds [min-max]",
        raw={m["case"]: {"sources": m["sources"], "seconds_per_round": m["seconds"]} for m in measured},
        device=args.device,
        directory=args.results_dir,
    )


if __name__ == "__main__":
    main()
