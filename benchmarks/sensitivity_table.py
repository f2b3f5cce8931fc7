"""The sensitivity catalogue of the per-example engines as a result file (docs/dp_callback.md).

For each model of :mod:`lightning_dprobust.audit.sensitivity` (layers and losses that mix examples, and separable
ones) and each engine (``vmap``, ``ghost``, ``auto``, ``ghost+probe``): the largest distance between the clipped sums
released for two neighbouring batches (an all-ones canary under two labels against the copies alone), in units of
the clip norm ``C``, over both protocols (the adversarial batch first, or after a warm-up step), or the refusal the
engine raised (nothing released). A guarantee holds where every outcome is <= 1 or a refusal. Deterministic: the
catalogue seeds its models and batches.

Usage: ``python benchmarks/sensitivity_table.py``
"""

from __future__ import annotations

import argparse

from lightning_dprobust.audit.sensitivity import COLUMNS, catalogue_rows
from results import add_results_arguments, result_name, write_result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_results_arguments(parser)
    args = parser.parse_args()
    rows = [list(row) for row in catalogue_rows()]
    for row in rows:
        print(" | ".join(row), flush=True)
    write_result(
        result_name(args, "sensitivity_catalogue"),
        title="Sensitivity of each engine's released clipped sum on adversarial neighbouring batches",
        columns=list(COLUMNS),
        rows=rows,
        notes="largest distance between the clipped sums of neighbouring batches over both protocols (adversarial "
        "batch first, or after a warm-up step), in units of C; 'refused': the engine raised and released nothing",
        directory=args.results_dir,
    )


if __name__ == "__main__":
    main()
