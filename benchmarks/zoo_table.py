"""The zoo's shipped classifiers and denoisers as a result file (docs/zoo.md): what each entry's build measured.

Reads the catalog (``zoo/entries/*.yaml``; ``zoo build`` wrote every metric there when it trained the entry) and
tabulates each shipped entry that classifies images, alone or behind its denoiser: its recorded epsilon as ``dprobust
zoo list`` shows it, its test accuracy, and its robustness record (PGD accuracy as mean +- std over the recorded
random starts, or certified accuracy at r = 0.25 and ACR under its smoothing sigma). Nothing is trained or evaluated
here; the numbers are the catalog's.

Usage: ``python benchmarks/zoo_table.py``
"""

from __future__ import annotations

import argparse

from lightning_dprobust.cli.zoo import epsilon_cell
from lightning_dprobust.zoo import list_entries
from lightning_dprobust.zoo.catalog import Entry
from results import add_results_arguments, result_name, write_result

KINDS = ("classifier", "denoiser")
"""Entry kinds tabulated; attacks, synthesizers and StoBatch's entries are on their methods' pages."""


def robustness_cell(entry: Entry) -> str:
    """The entry's robustness record in words, from its metrics (empty when it has none)."""
    metrics, meta = entry.meta["metrics"], entry.meta
    pgd = [key for key in metrics if key.startswith("pgd_") and key.endswith("_acc")]
    if pgd:
        key = pgd[0]
        eps = key[len("pgd_") : -len("_acc")]
        steps = (meta.get("robustness") or {}).get("steps")
        spread = f" +- {100 * metrics[key + '_std']:.2f}" if key + "_std" in metrics else ""
        return f"PGD-Linf {eps}{f' ({steps} steps)' if steps else ''}: {100 * metrics[key]:.2f}{spread} %"
    if "certified_acc@0.25" in metrics:
        sigma = (meta.get("smoothing") or {}).get("sigma")
        certified = 100 * metrics["certified_acc@0.25"]
        return f"sigma {sigma}: certified {certified:.2f} % at r = 0.25, ACR {metrics['acr']:.3f}"
    return ""


def rows() -> list[list[str]]:
    """One row per shipped entry of :data:`KINDS` (StoBatch excluded), in catalog order."""
    table = []
    for entry in list_entries():
        if not entry.shipped or entry.kind not in KINDS or entry.meta.get("method") == "StoBatch":
            continue
        accuracy = f"{100 * entry.meta['metrics']['test_acc']:.2f} %"
        if entry.kind == "denoiser":
            accuracy += f" (behind the denoiser, {entry.meta.get('classifier')})"
        table.append([f"`{entry.name}`", entry.meta["dataset"], epsilon_cell(entry), accuracy, robustness_cell(entry)])
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_results_arguments(parser)
    args = parser.parse_args()
    table = rows()
    for row in table:
        print(" | ".join(row))
    write_result(
        result_name(args, "zoo_shipped_classifiers"),
        title="Shipped zoo classifiers and denoisers: recorded epsilon, test accuracy and robustness",
        columns=["entry", "dataset", "epsilon (delta 1e-5)", "test acc", "robustness"],
        rows=table,
        notes="read from the catalog (zoo/entries/*.yaml), which zoo build wrote when it trained each entry; one "
        "training run per entry; PGD: mean +- std over the recorded random starts of that one model",
        directory=args.results_dir,
    )


if __name__ == "__main__":
    main()
