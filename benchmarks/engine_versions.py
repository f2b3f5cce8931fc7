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
        pair: [a / b for a, b in zip(times[pair[0]], times[pair[1]], strict=True)]
        for pair in (("new", "non-DP"), ("old", "non-DP"), ("new", "old"))
    }
    return (
        f"{case} ({sources['new']} vs {sources['old']}): ms non-DP {ms['non-DP']:.1f}, new {ms['new']:.1f}, "
        f"old {ms['old']:.1f}; new / non-DP {spread(ratio['new', 'non-DP'])}, old / non-DP "
        f"{spread(ratio['old', 'non-DP'])}, new / old {spread(ratio['new', 'old'])}"
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
    args = parser.parse_args()
    roots = {"new": str(Path(args.new).resolve()), "old": str(Path(args.old).resolve())}
    for version, root in roots.items():
        if not (Path(root) / "lightning_dprobust" / "__init__.py").is_file():
            parser.error(f"--{version} {root} holds no lightning_dprobust/ package")
    for case in args.cases:
        print(compare(case, roots, args.device, args.rounds, args.steps), flush=True)


if __name__ == "__main__":
    main()
