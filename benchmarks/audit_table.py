"""Privacy-audit table for the digits models: membership attacks and the one-run epsilon lower bound.

Rows: the non-private digits model, DP-SGD at epsilon 8, 3 and 1 (the recipes of the zoo entries
``mlp_tanh.erm_digits`` and ``mlp_tanh.dpsgd_digits_eps*``: ``configs/erm/digits.yaml`` and
``configs/dpsgd/digits.yaml``, mlp_tanh with 64 hidden units, Adam lr 0.02 with a cosine schedule, batch 256, 40
epochs, delta 1e-5), and a non-private reference trained to overfit (300 members, 100 epochs, batch 64) that shows
what the attacks find when there is leakage. For each row:

* membership attacks (:mod:`lightning_dprobust.audit.membership`): AUC of the loss, shadow-model (Salem et al.
  2019) and offline LiRA (Carlini et al. 2022) attacks, and their TPR at 0.1% and 1% FPR. Targets are the shipped
  zoo entries ``mlp_tanh.erm_digits`` / ``mlp_tanh.dpsgd_digits_eps*`` when present (members: the digits train
  split of seed 0, as their recipe), else trained here with the same recipe; shadow models follow that recipe.
* the one-run canary audit (Steinke et al. 2023): the epsilon the accountant claims for a run of the recipe with
  mislabeled canaries, and the empirical lower bound at 95% confidence.

Usage: ``python benchmarks/audit_table.py [--shadows 8] [--canaries 200] [--no-zoo] [--out FILE]``. The defaults
take about 4 minutes on 2 CPU cores; ``--shadows 4`` roughly halves the DP rows' shadow training.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass

import numpy as np
import torch
from torch.utils.data import ConcatDataset, Subset

from lightning_dprobust.audit.membership import MembershipReport, membership_audit
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


@dataclass(frozen=True)
class Row:
    """One audited model: its recipe, the zoo entry holding it (if any) and how many train examples it saw."""

    label: str
    recipe: Recipe
    zoo_name: str | None = None
    members: int | None = None


def _rows(overfit_members: int) -> list[Row]:
    names = {"non-private": "mlp_tanh.erm_digits"}
    names.update({f"DP-SGD eps={epsilon}": f"mlp_tanh.dpsgd_digits_eps{epsilon}" for epsilon in (8, 3, 1)})
    rows = [Row(label, zoo_recipe(name)[0], name) for label, name in names.items()]
    overfit = rows[0].recipe.replace(max_epochs=100, batch_size=64)
    rows.append(Row(f"non-private, overfit ({overfit_members} members)", overfit, None, overfit_members))
    return rows


def _shipped(name: str | None) -> bool:
    from lightning_dprobust import zoo

    return name is not None and any(entry.status == "shipped" for entry in zoo.list_entries(name))


def _membership(row: Row, datamodule, shadows: int, use_zoo: bool, seed: int) -> tuple[MembershipReport, str]:
    train, held_out = audit_splits(datamodule)
    dataset = ConcatDataset([train, *held_out])
    held = np.arange(len(train), len(dataset))
    if row.members is None:
        members, nonmembers, size = np.arange(len(train)), held, None
    else:
        chosen = np.random.default_rng(seed).permutation(len(train))
        members, nonmembers, size = np.sort(chosen[: row.members]), np.r_[chosen[row.members :], held], row.members
    if use_zoo and row.members is None and _shipped(row.zoo_name):
        from lightning_dprobust import zoo

        target, source = zoo.load(row.zoo_name), f"zoo {row.zoo_name}"
    else:
        target = train_classifier(row.recipe, Subset(dataset, members.tolist()), datamodule).module
        source = "trained here"
    shadow_fn = RecipeTrainer(row.recipe, dataset, datamodule)
    report = membership_audit(target, dataset, members, nonmembers, shadow_fn, shadows, seed=seed, shadow_size=size)
    return report, source


def _cells(row: Row, report: MembershipReport, canary) -> list[str]:
    metrics = report.metrics
    tprs = ["/".join(f"{metrics[name].tpr_at_low_fpr[fpr]:.3f}" for name in metrics) for fpr in LOW_FPRS]
    claimed = "inf" if np.isinf(canary.claimed_epsilon) else f"{canary.claimed_epsilon:.2f}"
    audit = canary.audit
    return [
        row.label,
        *(f"{metrics[name].auc:.3f}" for name in metrics),
        *tprs,
        claimed,
        f"{audit.epsilon_lower_bound:.2f} ({audit.correct}/{audit.guesses})",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shadows", type=int, default=8, help="shadow models per row (default: 8)")
    parser.add_argument("--canaries", type=int, default=200, help="canaries of the one-run audit (default: 200)")
    parser.add_argument("--overfit-members", type=int, default=300, help="members of the overfit row (default: 300)")
    parser.add_argument("--no-zoo", action="store_true", help="train every target here instead of loading the zoo")
    parser.add_argument("--seed", type=int, default=0, help="seed of the audits' random choices (default: 0)")
    parser.add_argument("--out", default=None, help="also write the table to this markdown file")
    args = parser.parse_args()
    torch.set_num_threads(min(torch.get_num_threads(), 2))
    _, datamodule = zoo_recipe("mlp_tanh.erm_digits")
    header = ["model", "AUC loss", "AUC shadow", "AUC LiRA", "TPR@0.1%FPR (l/s/L)", "TPR@1%FPR (l/s/L)",
              "claimed eps", "eps lower bound (correct/guesses)"]  # fmt: skip
    rows, notes, counts, start = [], [], set(), time.perf_counter()
    for row in _rows(args.overfit_members):
        report, source = _membership(row, datamodule, args.shadows, not args.no_zoo, args.seed)
        canary = canary_audit(row.recipe, datamodule, args.canaries)
        rows.append(_cells(row, report, canary))
        first = next(iter(report.metrics.values()))
        counts.add(first.num_nonmembers)
        notes.append(f"{row.label}: target {source}; {first.num_members} vs {first.num_nonmembers} evaluated")
        print(f"[{time.perf_counter() - start:6.0f} s] {' | '.join(rows[-1])}", flush=True)
    table = markdown_table(header, rows)
    caveats = "; ".join(low_fpr_note(count) for count in sorted(counts, reverse=True))
    text = (
        f"{table}\n\nMembership: {args.shadows} shadow models per row; TPR columns: loss/shadow/LiRA. {caveats}.\n"
        f"One-run audit: {args.canaries} mislabeled canaries, 95% confidence, delta 1e-5, union bound over the guess "
        f"grid. Total time {time.perf_counter() - start:.0f} s.\n" + "\n".join(f"- {note}" for note in notes)
    )
    print(f"\n{text}")
    if args.out:
        write_text(text, args.out)


if __name__ == "__main__":
    main()
