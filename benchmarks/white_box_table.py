"""White-box audit table for the digits DP-SGD recipe: epsilon lower bounds against the claimed epsilon.

Rows: ``configs/dpsgd/digits.yaml`` (mlp_tanh with 64 hidden units, Adam, batch 256, 40 epochs, delta 1e-5, rdp as its
zoo entries record) calibrated to epsilon 1, 3 and 8, and two deliberately broken mechanisms that still claim
epsilon 1: the noise multiplier of the epsilon-1 run divided by 10 (noise 10x smaller than accounted), and that
noise multiplier with the first step's noise added again at every step
(:func:`lightning_dprobust.audit.faults.replayed_noise`). Each row is audited twice, each time with its own training
run: the white-box one-run audit with 1,000 Dirac gradient canaries (:func:`lightning_dprobust.audit.white_box_audit`)
and the black-box one with 200 mislabeled canaries (:func:`lightning_dprobust.audit.runner.canary_audit`, as in
``benchmarks/audit_table.py``); both at 95 % confidence. A broken run's claimed epsilon is that of the epsilon-1 run
of the same audit (same canaries, so the same sample rate and steps).

Usage: ``python benchmarks/white_box_table.py [--gradient-canaries 1000] [--canaries 200] [--epochs 40] [--out FILE]``
(about 10 minutes on 2 CPU cores).
"""

from __future__ import annotations

import argparse
import contextlib
import time
from pathlib import Path

from lightning_dprobust.audit import white_box_audit
from lightning_dprobust.audit.faults import replayed_noise
from lightning_dprobust.audit.runner import canary_audit
from lightning_dprobust.recipes import load_recipe
from lightning_dprobust.robustness.reports import markdown_table, write_text
from results import add_results_arguments, result_name, write_result

CONFIG = Path(__file__).resolve().parents[1] / "configs" / "dpsgd" / "digits.yaml"
ROWS = (
    ("DP-SGD eps=1", 1.0, None),
    ("DP-SGD eps=3", 3.0, None),
    ("DP-SGD eps=8", 8.0, None),
    ("broken: claims eps=1, noise 10x smaller", None, "quiet"),
    ("broken: claims eps=1, noise replayed every step", None, "replay"),
)


def _audit_all(kind: str, recipe, datamodule, canaries: int) -> list[tuple[float, float, str]]:
    """(claimed epsilon, lower bound, detail) of every row for one kind of audit (``"white"`` or ``"black"``)."""
    results, sigma_one, claimed_one = [], None, None
    for _, target, fault in ROWS:
        dp = {key: value for key, value in recipe.dp.items() if key not in ("target_epsilon", "noise_multiplier")}
        dp |= (
            {"target_epsilon": target} if target else {"noise_multiplier": sigma_one / (10 if fault == "quiet" else 1)}
        )
        run = recipe.replace(dp=dp)
        with replayed_noise() if fault == "replay" else contextlib.nullcontext():
            if kind == "white":
                report = white_box_audit(run, datamodule, canaries)
                detail = f"{report.audit.correct}/{report.audit.guesses} ({report.score})"
            else:
                report = canary_audit(run, datamodule, canaries)
                detail = f"{report.audit.correct}/{report.audit.guesses}"
        if target == 1.0:
            sigma_one, claimed_one = report.history[0][0], report.claimed_epsilon
        claimed = report.claimed_epsilon if target else claimed_one
        results.append((claimed, report.audit.epsilon_lower_bound, detail))
        print(f"{kind}-box {ROWS[len(results) - 1][0]}: claimed {claimed:.3f}, bound {results[-1][1]:.3f}", flush=True)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gradient-canaries", type=int, default=1000)
    parser.add_argument("--canaries", type=int, default=200)
    parser.add_argument("--epochs", type=int, default=40)
    parser.add_argument("--out", help="also write the markdown table to this file")
    add_results_arguments(parser)
    args = parser.parse_args()
    start = time.time()
    recipe, datamodule = load_recipe(CONFIG)
    recipe = recipe.replace(max_epochs=args.epochs)
    white = _audit_all("white", recipe, datamodule, args.gradient_canaries)
    black = _audit_all("black", recipe, datamodule, args.canaries)
    header = ["run", "claimed epsilon", "white-box lower bound", "correct/guesses (score)", "black-box lower bound"]
    rows = [
        [label, f"{w[0]:.3f}", f"**{w[1]:.3f}**" if w[1] > w[0] else f"{w[1]:.3f}", w[2], f"{b[1]:.3f}"]
        for (label, _, _), w, b in zip(ROWS, white, black, strict=True)
    ]
    table = markdown_table(header, rows)
    print(f"\n{table}\n\n({time.time() - start:.0f} s)")
    if args.out:
        write_text(table, args.out)
    write_result(
        result_name(args, "white_box_audit_digits"),
        title="White-box and black-box one-run audits of the digits DP-SGD recipe: epsilon lower bounds",
        columns=header,
        rows=rows,
        notes=f"one training run per row and audit; {args.gradient_canaries} Dirac gradient canaries (white-box), "
        f"{args.canaries} mislabeled canaries (black-box), {args.epochs} epochs, 95 % confidence; bold: a lower "
        "bound above the claimed epsilon",
        directory=args.results_dir,
    )


if __name__ == "__main__":
    main()
