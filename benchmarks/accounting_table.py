"""Epsilon of the shipped digits recipes under the rdp, prv and pld accountants, and what pld saves.

Rows: every private digits zoo entry (``zoo/entries/*digits*.yaml``) with an accounted guarantee (entries whose
epsilon is nominal, e.g. StoBatch and TransDenoiser, have no Gaussian mechanism to account and are left out), read for
the mechanism its recipe ran (noise multiplier, Poisson sample rate, steps, delta; ``configs/dpsgd/digits.yaml`` and
its siblings: batch 256 of 1,293 examples, 40 epochs). For each: epsilon under each accountant, the epsilon pld saves
over rdp, and the noise multiplier each accountant would calibrate for the entry's target epsilon (less noise for the
same guarantee).

Usage: ``python benchmarks/accounting_table.py [--out FILE]`` (about a minute on 2 CPU cores; prv is the slow one).
"""

from __future__ import annotations

import argparse
import time

from lightning_dprobust import zoo
from lightning_dprobust.core.accounting import epsilon_for
from lightning_dprobust.core.calibration import calibrate_noise_multiplier
from lightning_dprobust.robustness.reports import markdown_table, write_text
from results import add_results_arguments, result_name, write_result

ACCOUNTANTS = ("rdp", "prv", "pld")


def _entries() -> list[tuple[str, dict, float]]:
    """(name, privacy meta, target epsilon) of every private digits entry, sorted by target."""
    rows = []
    for entry in zoo.list_entries("*digits*"):
        privacy = entry.meta["privacy"]
        if privacy is not None and privacy.get("accountant") != "nominal":  # a nominal epsilon has no mechanism
            overrides = entry.meta["recipe"].get("overrides") or {}
            target = overrides.get("dp.target_epsilon", 3.0)  # the recipes' default target is 3
            rows.append((entry.name, privacy, float(target)))
    return sorted(rows, key=lambda row: (row[2], row[0]))


def _row(name: str, privacy: dict, target: float) -> list[str]:
    sigma, q, steps, delta = privacy["noise_multiplier"], privacy["sample_rate"], privacy["steps"], privacy["delta"]
    epsilons = {accountant: epsilon_for([(sigma, q, steps)], delta, accountant) for accountant in ACCOUNTANTS}
    saved = epsilons["rdp"] - epsilons["pld"]
    sigmas = {a: calibrate_noise_multiplier(target, delta, q, steps, accountant=a) for a in ("rdp", "pld")}
    return [
        name, f"{sigma:.4g}", f"{q:.4f}", steps, f"{delta:g}",
        *(f"{epsilons[a]:.3f}" for a in ACCOUNTANTS),
        f"{saved:.3f} ({100 * saved / epsilons['rdp']:.1f} %)",
        f"{target:g}: {sigmas['rdp']:.3f} -> {sigmas['pld']:.3f} ({100 * (1 - sigmas['pld'] / sigmas['rdp']):.1f} %)",
    ]  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", help="also write the markdown table to this file")
    add_results_arguments(parser)
    args = parser.parse_args()
    start = time.time()
    header = ["entry", "sigma", "q", "steps", "delta", *(f"eps {a}" for a in ACCOUNTANTS), "pld saves vs rdp",
              "target: sigma rdp -> pld (less noise)"]  # fmt: skip
    rows = [_row(*entry) for entry in _entries()]
    table = markdown_table(header, rows)
    print(table)
    print(f"\n({time.time() - start:.0f} s)")
    if args.out:
        write_text(table, args.out)
    write_result(
        result_name(args, "accounting_digits"),
        title="Epsilon of the private digits zoo entries under the rdp, prv and pld accountants",
        columns=header,
        rows=rows,
        notes="one computation, nothing drawn: epsilon follows from each entry's recorded mechanism (sigma, q, "
        "steps, delta); the last column is the noise multiplier each accountant calibrates for the entry's target "
        "epsilon",
        directory=args.results_dir,
    )


if __name__ == "__main__":
    main()
