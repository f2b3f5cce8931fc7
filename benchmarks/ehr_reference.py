"""Reference points of the synthetic-EHR metrics on the embedded synthetic EHR set: what a perfect synthesizer and
what structure-free ones score, so a trained generator's numbers can be read on the same scale.

The real set is the test split (200 records) of ``EHRDataModule()`` (2,000 records, split seed 0, scaled with the
synthetic source's declared public ranges, so distances are in those units). Each row is a
set of 200 records scored against it with ``similarity_report`` (k-means with 3 clusters, Hungarian pairing, p = 2,
features #0, #4, #7); each seed changes the k-means seed and, except for ``train_split``, the candidate set:

* ``oracle``: fresh records of the same generator (seed ``1000 + seed``), preprocessed with the same schema;
* ``no_structure``: fresh records of a generator without static effects, trend and seasonal components;
* ``shuffled_marginals``: training records whose every (step, feature) cell is permuted across records, so each
  marginal is kept and every within-record dependence is destroyed;
* ``train_split``: 200 real training records (a generator that memorized its training data would score like this).

Usage: ``python benchmarks/ehr_reference.py [--seeds 0 1 2]``.
"""

from __future__ import annotations

import argparse
from dataclasses import replace

import torch
from seeds import DEFAULT_SEEDS, Sweep, sweep

from lightning_dprobust.data.ehr import EHRDataModule
from lightning_dprobust.data.ehr_records import encode
from lightning_dprobust.data.ehr_synthetic import STRUCTURE, synthetic_records
from lightning_dprobust.metrics.synthetic import similarity_report
from results import add_results_arguments, result_name, write_result

ROWS = ("train_split", "oracle", "no_structure", "shuffled_marginals")
LABELS = {
    "train_split": "train split (real records)",
    "oracle": "fresh draw of the generator",
    "no_structure": "generator without static effects, trend, seasons",
    "shuffled_marginals": "training cells shuffled across records",
}
"""How the table names each row."""
HEADINGS = {"feature_0/minkowski": "#0 minkowski", "feature_4/minkowski": "#4 minkowski",
            "feature_7/minkowski": "#7 minkowski", "missing_wasserstein": "missing W1",
            "increment_wasserstein": "increment W1"}  # fmt: skip
"""How the table names each column (``synthetic/`` dropped)."""
COLUMNS = (
    "synthetic/minkowski",
    "synthetic/cosine",
    "synthetic/feature_0/minkowski",
    "synthetic/feature_4/minkowski",
    "synthetic/feature_7/minkowski",
    "synthetic/missing_wasserstein",
    "synthetic/increment_wasserstein",
)
FLAT = replace(STRUCTURE, **{name: (0.0,) * 8 for name in ("age", "gender", "trend", "daily", "yearly")})
FLAT = replace(FLAT, race=((0.0, 0.0, 0.0),) * 8)


def candidate(row: str, datamodule: EHRDataModule, n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``n`` records of ``row`` as preprocessed ``(x, m)``."""
    if row in ("oracle", "no_structure"):
        structure = STRUCTURE if row == "oracle" else FLAT
        return encode(synthetic_records(n, seed=1000 + seed, structure=structure), datamodule.schema)
    x, m = (tensor[:n].clone() for tensor in datamodule.train_set.tensors)
    if row == "shuffled_marginals":
        generator = torch.Generator().manual_seed(seed)
        order = torch.argsort(torch.rand(x.shape, generator=generator), dim=0)
        x, m = torch.gather(x, 0, order), torch.gather(m, 0, order)
    return x, m


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=list(DEFAULT_SEEDS), help="seeds (default: 0 1 2)")
    add_results_arguments(parser)
    args = parser.parse_args()
    datamodule = EHRDataModule()
    datamodule.setup()
    real = datamodule.test_set.tensors
    results: dict[str, Sweep] = {}
    for row in ROWS:

        def run(seed: int, row: str = row) -> dict[str, float]:
            return similarity_report(real, candidate(row, datamodule, len(real[0]), seed), seed=seed)

        results[row] = sweep(run, args.seeds, row)
    names = [key.removeprefix("synthetic/") for key in COLUMNS]
    header = ["set", *(HEADINGS.get(name, name) for name in names)]
    rows = [[LABELS[row], *(result.cell(key, digits=3) for key in COLUMNS)] for row, result in results.items()]
    print("| " + " | ".join(header) + " |")
    print("|---" * (len(COLUMNS) + 1) + "|")
    for cells in rows:
        print("| " + " | ".join(cells) + " |")
    note = f"{next(iter(results.values())).note()}; real set: {len(real[0])} test records"
    print(f"\n{note}")
    write_result(
        result_name(args, "ehr_reference"),
        title="Reference points of the synthetic-EHR metrics on the embedded synthetic EHR set",
        columns=header,
        rows=rows,
        seeds=args.seeds,
        notes=note,
        raw={row: result.runs for row, result in results.items()},
        directory=args.results_dir,
    )


if __name__ == "__main__":
    main()
