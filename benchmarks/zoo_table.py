"""The zoo's shipped classifiers and denoisers as a result file (docs/zoo.md): what each entry's build measured.

Reads the catalog (``zoo/entries/*.yaml``; ``zoo build`` wrote every metric there when it trained the entry) and
tabulates each shipped entry that classifies images, alone or behind its denoiser: its recorded epsilon as ``dprobust
zoo list`` shows it, its test accuracy, and its robustness record (PGD accuracy as mean +- std over the recorded
random starts, or certified accuracy at r = 0.25 and ACR under its smoothing sigma). Nothing is trained or evaluated
here; the numbers are the catalog's.

``--method NAME`` tabulates one method's shipped entries instead, whatever their kind (e.g. ``StoBatch`` for its page,
``AIN`` for the attack generators: their success rates against their target), into ``zoo_<method>``.

Usage: ``python benchmarks/zoo_table.py [--method StoBatch|AIN]``
"""

from __future__ import annotations

import argparse

from lightning_dprobust.cli.zoo import epsilon_cell
from lightning_dprobust.zoo import list_entries
from lightning_dprobust.zoo.catalog import Entry
from results import add_results_arguments, result_name, write_result

KINDS = ("classifier", "denoiser")
"""Entry kinds of the main table; attacks, synthesizers and StoBatch's entries are on their methods' pages."""
OWN_PAGE = ("StoBatch",)
"""Methods whose classifiers are tabulated on their own page (``--method``), not in the main table."""


def robustness_cell(entry: Entry) -> str:
    """The entry's robustness record in words, from its metrics (empty when it has none)."""
    metrics, meta = entry.meta["metrics"], entry.meta
    success = sorted((float(key.split("@")[1]), value) for key, value in metrics.items() if key.startswith("success@"))
    if success:
        record = meta.get("robustness") or {}
        target = meta.get("classifier") + (f", class {record['target_class']}" if record.get("target_class") else "")
        bounds = " / ".join(f"{bound:g}" for bound, _ in success)
        rates = " / ".join(f"{100 * rate:.2f}" for _, rate in success)
        return f"against {target}, trained to Linf {metrics['bound']:g}: success at Linf {bounds}: {rates} %"
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


def rows(method: str | None = None) -> list[list[str]]:
    """One row per shipped entry, in catalog order: of ``method`` (any kind), or else of :data:`KINDS` except the
    methods of :data:`OWN_PAGE`."""
    table = []
    for entry in list_entries():
        own = entry.meta.get("method")
        wanted = own == method if method else entry.kind in KINDS and own not in OWN_PAGE
        if not entry.shipped or not wanted:
            continue
        measured = entry.meta["metrics"]
        accuracy = f"{100 * measured['test_acc']:.2f} %" if "test_acc" in measured else ""
        if entry.kind == "denoiser":
            accuracy += f" (behind the denoiser, {entry.meta.get('classifier')})"
        table.append([f"`{entry.name}`", entry.meta["dataset"], epsilon_cell(entry), accuracy, robustness_cell(entry)])
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--method", help="one method's shipped entries (its meta.method, e.g. StoBatch or AIN)")
    add_results_arguments(parser)
    args = parser.parse_args()
    table = rows(args.method)
    if not table:
        parser.error(f"no shipped zoo entry has method {args.method!r}")
    for row in table:
        print(" | ".join(row))
    write_result(
        result_name(args, f"zoo_{args.method.lower()}" if args.method else "zoo_shipped_classifiers"),
        title=f"Shipped zoo entries of {args.method}: recorded epsilon, test accuracy and robustness"
        if args.method
        else "Shipped zoo classifiers and denoisers: recorded epsilon, test accuracy and robustness",
        columns=["entry", "dataset", "epsilon (delta 1e-5)", "test acc", "robustness"],
        rows=table,
        notes="read from the catalog (zoo/entries/*.yaml), which zoo build wrote when it trained each entry; one "
        "training run per entry; PGD: mean +- std over the recorded random starts of that one model",
        directory=args.results_dir,
    )


if __name__ == "__main__":
    main()
