"""Privacy-audit table for the digits models: membership attacks and the one-run epsilon lower bound, over seeds.

Rows: the non-private digits model, DP-SGD at epsilon 8, 3 and 1 (the recipes of the zoo entries
``mlp_tanh.erm_digits`` and ``mlp_tanh.dpsgd_digits_eps*``: ``configs/erm/digits.yaml`` and
``configs/dpsgd/digits.yaml``, mlp_tanh with 64 hidden units, Adam lr 0.02 with a cosine schedule, batch 256, 40
epochs, delta 1e-5), and a non-private reference trained to overfit (300 members, 100 epochs, batch 64) that shows
what the attacks find when there is leakage. For each row and each seed (``--seeds``, default 0 1 2: the recipe's
seed, so model initialization, and the seed of the audits' random choices; the DP rows' Poisson sampling and noise
come from the ``DPCallback``'s secret randomness, its default, so they differ at every run):

* membership attacks (:mod:`lightning_dprobust.audit.membership`): AUC of the loss, shadow-model (Salem et al.
  2019) and offline LiRA (Carlini et al. 2022) attacks, and their TPR at 0.1% and 1% FPR. The target is trained here
  with the row's recipe on the digits train split (split seed 0, as the zoo recipes); shadow models follow that
  recipe.
* the one-run canary audit (Steinke et al. 2023): the epsilon the accountant claims for a run of the recipe with
  mislabeled canaries, and the empirical lower bound at 95% confidence.

Every cell is mean +- sample standard deviation over the seeds (``benchmarks/seeds.py``); the last column is the
largest lower bound of any seed. Usage: ``python benchmarks/audit_table.py [--seeds 0 1 2] [--shadows 8]
[--canaries 200] [--out FILE]``.
Seeds can run in parallel processes (``--seeds 0 --save-runs s0.json`` ...) and be tabulated with ``--from-runs``.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass

import numpy as np
import torch
from seeds import Sweep, add_seed_arguments, run_or_load
from torch.utils.data import ConcatDataset, Subset

from lightning_dprobust.audit.membership import ATTACKS, MembershipReport, membership_audit
from lightning_dprobust.audit.roc import LOW_FPRS, low_fpr_note
from lightning_dprobust.audit.runner import (
    Recipe,
    RecipeTrainer,
    audit_splits,
    canary_audit,
    train_classifier,
    zoo_recipe,
)
from lightning_dprobust.robustness.reports import markdown_table, write_text
from results import add_results_arguments, result_name, write_result


@dataclass(frozen=True)
class Row:
    """One audited model: its recipe and how many train examples it saw (``None``: the whole train split)."""

    label: str
    recipe: Recipe
    members: int | None = None


def _rows(overfit_members: int) -> list[Row]:
    names = {"non-private": "mlp_tanh.erm_digits"}
    names.update({f"DP-SGD eps={epsilon}": f"mlp_tanh.dpsgd_digits_eps{epsilon}" for epsilon in (8, 3, 1)})
    rows = [Row(label, zoo_recipe(name)[0]) for label, name in names.items()]
    overfit = rows[0].recipe.replace(max_epochs=100, batch_size=64)
    rows.append(Row(f"non-private, overfit ({overfit_members} members)", overfit, overfit_members))
    return rows


def _membership(row: Row, datamodule, shadows: int, seed: int) -> MembershipReport:
    train, held_out = audit_splits(datamodule)
    dataset = ConcatDataset([train, *held_out])
    held = np.arange(len(train), len(dataset))
    if row.members is None:
        members, nonmembers, size = np.arange(len(train)), held, None
    else:
        chosen = np.random.default_rng(seed).permutation(len(train))
        members, nonmembers, size = np.sort(chosen[: row.members]), np.r_[chosen[row.members :], held], row.members
    recipe = row.recipe.replace(seed=seed)
    target = train_classifier(recipe, Subset(dataset, members.tolist())).module
    shadow_fn = RecipeTrainer(recipe, dataset)
    return membership_audit(target, dataset, members, nonmembers, shadow_fn, shadows, seed=seed, shadow_size=size)


def run_seed(seed: int, rows: list[Row], datamodule, args: argparse.Namespace) -> dict[str, float]:
    """Every row's audit metrics at one seed, keyed ``<row index>/<metric>``."""
    metrics = {}
    for index, row in enumerate(rows):
        report = _membership(row, datamodule, args.shadows, seed)
        canary = canary_audit(row.recipe.replace(seed=seed), datamodule, args.canaries)
        for name, roc in report.metrics.items():
            metrics[f"{index}/auc/{name}"] = roc.auc
            metrics |= {f"{index}/tpr{fpr:g}/{name}": roc.tpr_at_low_fpr[fpr] for fpr in LOW_FPRS}
        metrics[f"{index}/claimed"] = canary.claimed_epsilon
        metrics[f"{index}/lower"] = canary.audit.epsilon_lower_bound
        metrics[f"{index}/nonmembers"] = next(iter(report.metrics.values())).num_nonmembers
    return metrics


def _cells(index: int, label: str, result: Sweep) -> list[str]:
    names = ATTACKS
    tprs = ["/".join(result.cell(f"{index}/tpr{fpr:g}/{name}", digits=3) for name in names) for fpr in LOW_FPRS]
    claimed = result.values(f"{index}/claimed")
    claimed_cell = "inf" if np.isinf(claimed).all() else result.cell(f"{index}/claimed")
    lower = result.values(f"{index}/lower")
    return [
        label,
        *(result.cell(f"{index}/auc/{name}", digits=3) for name in names),
        *tprs,
        claimed_cell,
        result.cell(f"{index}/lower"),
        f"{lower.max():.2f}",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shadows", type=int, default=8, help="shadow models per row (default: 8)")
    parser.add_argument("--canaries", type=int, default=200, help="canaries of the one-run audit (default: 200)")
    parser.add_argument("--overfit-members", type=int, default=300, help="members of the overfit row (default: 300)")
    parser.add_argument("--out", default=None, help="also write the table to this markdown file")
    add_seed_arguments(parser)
    add_results_arguments(parser)
    args = parser.parse_args()
    torch.set_num_threads(min(torch.get_num_threads(), 2))
    _, datamodule = zoo_recipe("mlp_tanh.erm_digits")
    rows, start = _rows(args.overfit_members), time.perf_counter()
    result = run_or_load(lambda seed: run_seed(seed, rows, datamodule, args), args, label="audit")
    header = ["model", "AUC loss", "AUC shadow", "AUC LiRA", "TPR@0.1%FPR (l/s/L)", "TPR@1%FPR (l/s/L)",
              "claimed eps", "eps lower bound", "max lower bound"]  # fmt: skip
    cells = [_cells(index, row.label, result) for index, row in enumerate(rows)]
    table = markdown_table(header, cells)
    counts = sorted(
        {int(value) for key in result.runs[0] if key.endswith("/nonmembers") for value in result.values(key)}
    )
    caveats = "; ".join(low_fpr_note(count) for count in reversed(counts))
    text = (
        f"{table}\n\n{result.note()}. Membership: {args.shadows} shadow models per row; TPR columns: "
        f"loss/shadow/LiRA. {caveats}.\nOne-run audit: {args.canaries} mislabeled canaries, 95% confidence, delta "
        f"1e-5, union bound over the guess grid."
        + ("" if args.from_runs else f" Total time {time.perf_counter() - start:.0f} s.")
    )
    print(f"\n{text}")
    if args.out:
        write_text(text, args.out)
    write_result(
        result_name(args, "audit_digits"),
        title="Privacy audit of the digits models: membership attacks and the one-run epsilon lower bound",
        columns=header,
        rows=cells,
        seeds=result.seeds,
        notes=f"{result.note()}; {args.shadows} shadow models per row; TPR columns: loss/shadow/LiRA; {caveats}; "
        f"one-run audit: {args.canaries} mislabeled canaries, 95% confidence, delta 1e-5",
        raw={"runs": result.runs},
        directory=args.results_dir,
    )


if __name__ == "__main__":
    main()
