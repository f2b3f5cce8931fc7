"""``dprobust audit``: membership inference on a checkpoint, or a one-run canary audit of a training config.

Two modes, chosen by the flags:

* ``dprobust audit --ckpt_path PATH_OR_ZOO [--data digits]``: the loss, shadow-model and offline LiRA attacks
  (:mod:`lightning_dprobust.audit.membership`); members are the data module's train split for ``--split_seed``,
  non-members its validation and test splits. ``--attack salem`` runs the residual-perturbation paper's protocol
  (:func:`lightning_dprobust.audit.salem.salem_checkpoint_audit`: one shadow model, a k-64-2 attack MLP, precision
  and recall at its thresholds) on the same members and non-members.
* ``dprobust audit --config CONFIG --canaries M [--epochs N] [--no_dp]``: the one-run audit of Steinke et al. 2023
  (:func:`lightning_dprobust.audit.runner.canary_audit`): prints the claimed epsilon and the empirical lower bound.
* ``dprobust audit --config CONFIG --white_box [--gradient_canaries M] [--canaries M] [--engine auto|ghost|vmap]``:
  the white-box one-run audit with Dirac gradient canaries (:func:`lightning_dprobust.audit.white_box_audit`) next to
  the black-box canary audit (default 200 canaries) and the claimed epsilon, both trained with the per-example
  clipping engine ``--engine`` names (default: the config's ``dp.engine``, else ``auto``).

Usage errors raise ``ValueError`` naming the flag; ``dprobust`` reports them in one line with exit status 2.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Sequence
from pathlib import Path

from lightning_dprobust.audit.membership import ATTACKS, MembershipReport
from lightning_dprobust.audit.roc import LOW_FPRS, low_fpr_note, plot_roc
from lightning_dprobust.audit.runner import (
    CanaryReport,
    canary_audit,
    checkpoint_membership_audit,
    checkpoint_salem_audit,
    zoo_recipe,
)
from lightning_dprobust.audit.salem import SalemReport, SalemSplit
from lightning_dprobust.audit.white_box import WhiteBoxReport, audited_engine, white_box_audit
from lightning_dprobust.cli.args import (
    CommandParser,
    add_ckpt_flag,
    add_data_flags,
    add_output_flags,
    check_out,
    check_wandb_login,
    resolve_device,
    run_folder,
    wandb_options,
)
from lightning_dprobust.core.engines import ENGINES
from lightning_dprobust.data import DATAMODULES
from lightning_dprobust.recipes import Recipe, load_recipe
from lightning_dprobust.robustness.reports import log_wandb, markdown_table, write_text
from lightning_dprobust.zoo.catalog import ZooError

SALEM = "salem"
"""The ``--attack`` name of the Salem et al. protocol of the residual-perturbation paper."""


def _parser() -> CommandParser:
    parser = CommandParser(prog="dprobust audit", description=__doc__.split("\n\n")[0], flag_file=False)
    add, flag = parser.add_argument, parser.add_flag
    add_ckpt_flag(parser, "membership attacks on this .ckpt or zoo entry", repeat=False, required=False)
    add_data_flags(parser, prefix="--ckpt_path mode: ")
    flag(
        "--split_seed",
        "--split-seed",
        type=int,
        default=0,
        help="--ckpt_path mode: the data module seed it was trained with (default 0)",
    )
    add("--shadows", type=int, default=8, help="--ckpt_path mode: shadow models of shadow, lira (default: 8)")
    add(
        "--attack",
        action="append",
        choices=(*ATTACKS, SALEM),
        help="--ckpt_path mode: attack to run; repeat (default: loss, shadow, lira; salem: the residual-perturbation "
        "paper's shadow-model protocol)",
    )
    flag(
        "--salem_lr",
        "--salem-lr",
        type=float,
        default=0.1,
        help="--attack salem: Adam learning rate of its MLP (default: 0.1)",
    )
    flag(
        "--batch_size",
        "--batch-size",
        type=int,
        default=256,
        help="--ckpt_path mode without --config: shadow batch size (default: 256)",
    )
    add("--config", help="training config: the audited recipe (--canaries) or the shadow models' recipe (--ckpt_path)")
    add("--canaries", type=int, help="one-run audit with this many canaries (needs --config)")
    flag(
        "--white_box",
        "--white-box",
        action="store_true",
        help="white-box one-run audit with gradient canaries (needs --config)",
    )
    flag(
        "--gradient_canaries",
        "--gradient-canaries",
        type=int,
        default=1000,
        help="--white_box: gradient canaries (default: 1000)",
    )
    add(
        "--engine",
        choices=ENGINES,
        help="--white_box: per-example clipping engine of the audited runs (default: the config's dp.engine, or auto)",
    )
    add("--epochs", type=int, help="epochs of every model this command trains (default: the recipe's, else 40)")
    flag("--no_dp", "--no-dp", action="store_true", help="drop the config's DPCallback (no clipping, no noise)")
    flag(
        "--dp.target_epsilon",
        "--target-epsilon",
        "--target_epsilon",
        dest="target_epsilon",
        type=float,
        help="override the DPCallback's target_epsilon",
    )
    add("--beta", type=float, default=0.05, help="--canaries mode: 1 - confidence of the bound (default: 0.05)")
    add("--delta", type=float, help="--canaries mode: delta of the tested hypothesis (default: the run's, else 1e-5)")
    add("--seed", type=int, help="seed of training (default: the config's) and of the audit's random choices (0)")
    add_output_flags(parser, "audit", "<ckpt-or-config-stem>")
    return parser  # fmt: skip


def _check(args: argparse.Namespace) -> None:
    if (args.ckpt is None) == (args.canaries is None and not args.white_box):
        raise ValueError(
            "dprobust audit: give either --ckpt_path (membership attacks) or --canaries / --white_box with --config"
        )
    if (args.canaries is not None or args.white_box) and args.config is None:
        flag = "--white_box" if args.white_box else "--canaries"
        raise ValueError(f"{flag} needs --config, the training recipe to audit (e.g. configs/dpsgd/digits.yaml)")
    if args.white_box and args.no_dp:
        raise ValueError("--white_box audits a DP run (gradient canaries are private examples): drop --no_dp")
    if args.no_dp and args.target_epsilon is not None:
        raise ValueError(
            f"--dp.target_epsilon {args.target_epsilon:g} with --no_dp: a run without DP has no epsilon to target; "
            "drop one of them"
        )
    checks = [
        ("--canaries", args.canaries, args.canaries is None or args.canaries >= 2, "an integer >= 2"),
        ("--shadows", args.shadows, args.shadows >= 0, "an integer >= 0"),
        ("--gradient_canaries", args.gradient_canaries, args.gradient_canaries >= 2, "an integer >= 2"),
        ("--epochs", args.epochs, args.epochs is None or args.epochs >= 1, "an integer >= 1"),
        ("--batch_size", args.batch_size, args.batch_size >= 1, "an integer >= 1"),
        ("--beta", args.beta, 0 < args.beta < 1, "in (0, 1)"),
        ("--salem_lr", args.salem_lr, math.isfinite(args.salem_lr) and args.salem_lr > 0, "> 0"),
        ("--delta", args.delta, args.delta is None or 0 <= args.delta < 1, "in [0, 1)"),
        (
            "--dp.target_epsilon",
            args.target_epsilon,
            args.target_epsilon is None or (math.isfinite(args.target_epsilon) and args.target_epsilon > 0),
            "> 0",
        ),
    ]
    check_out(args.out, args.overwrite)
    for flag, value, ok, expected in checks:
        if not ok:
            raise ValueError(f"{flag} must be {expected}, got {value!r}")
    if args.wandb:
        check_wandb_login()


def _adjust(recipe: Recipe, args: argparse.Namespace) -> Recipe:
    """Apply ``--epochs``, ``--no-dp``, ``--target-epsilon`` and ``--seed`` to ``recipe``."""
    changes: dict = {"max_epochs": args.epochs, "seed": args.seed}
    if args.no_dp:
        changes["dp"] = None
    elif args.target_epsilon is not None:
        if recipe.dp is None:
            raise ValueError("--target-epsilon needs a config with a `dp` group (drop --no-dp)")
        dp = {key: value for key, value in recipe.dp.items() if key != "noise_multiplier"}
        changes["dp"] = dp | {"target_epsilon": args.target_epsilon}
    return recipe.replace(**changes)


def _label(args: argparse.Namespace) -> str:
    """The run folder's name: the checkpoint's stem or zoo name, else the config's stem."""
    source = Path(args.ckpt if args.ckpt is not None else args.config)
    return source.stem if source.suffix in (".ckpt", ".yaml", ".yml") else str(source)


def _finish(args: argparse.Namespace, out: Path, summary: str, metrics: dict, images: dict) -> None:
    written = [write_text(summary, out / "audit.md"), *images.values()]
    if args.wandb:
        written.append(log_wandb(out, "audit", vars(args), metrics, images, **wandb_options(args)))
    print("\nwrote:")
    for path in written:
        if path is not None:
            print(f"  {path}")


# ----------------------------------------------------------------------------------------------------- canaries
def _claimed(epsilon: float) -> str:
    return "inf (no DP)" if math.isinf(epsilon) else f"{epsilon:.3f}"


def format_canary_report(report: CanaryReport, label: str) -> str:
    """Markdown: the claimed epsilon next to the empirical lower bound, and how the bound was obtained."""
    audit = report.audit
    auc = f"{report.canary_roc.auc:.3f}" if report.canary_roc is not None else "n/a"
    bound, guesses = f"{audit.epsilon_lower_bound:.3f}", f"{audit.correct}/{audit.guesses}"
    rows = [[label, _claimed(report.claimed_epsilon), bound, guesses, f"{audit.k_plus}/{audit.k_minus}", auc,
             f"{report.test_accuracy:.3f}"]]  # fmt: skip
    header = ["run", "claimed epsilon", "epsilon lower bound", "correct/guesses", "k+/k-", "canary AUC", "accuracy"]
    return (
        f"{markdown_table(header, rows)}\n\n"
        f"One-run audit (Steinke, Nasr, Jagielski 2023, arXiv 2305.08846, Theorem 5.2): {audit.num_canaries} "
        f"mislabeled held-out canaries, {int(report.included.sum())} included; lower bound at "
        f"{100 * (1 - audit.beta):g}% confidence for delta={audit.delta:g}, union bound over "
        f"{audit.num_candidates} guess counts. Accuracy: held-out examples that are not canaries."
    )


def _canary_mode(args: argparse.Namespace, device: str) -> None:
    recipe, datamodule = load_recipe(args.config)
    recipe = _adjust(recipe, args)
    report = canary_audit(recipe, datamodule, args.canaries, beta=args.beta, delta=args.delta, device=device)
    config = Path(args.config)
    summary = format_canary_report(report, f"{config.parent.name}/{config.stem}" + (" (no DP)" if args.no_dp else ""))
    print(f"\n{summary}\n")
    claimed = _claimed(report.claimed_epsilon)
    print(f"claimed epsilon: {claimed}; empirical lower bound: {report.audit.epsilon_lower_bound:.3f}")
    metrics = {
        "canary/epsilon_lower_bound": report.audit.epsilon_lower_bound,
        "canary/correct": report.audit.correct,
        "canary/guesses": report.audit.guesses,
        "canary/test_accuracy": report.test_accuracy,
    }
    if math.isfinite(report.claimed_epsilon):
        metrics["canary/claimed_epsilon"] = report.claimed_epsilon
    if report.canary_roc is not None:
        metrics["canary/auc"] = report.canary_roc.auc
    _finish(args, run_folder(args.out, "audit", _label(args)), summary, metrics, {})


def format_white_box_report(white: WhiteBoxReport, black: CanaryReport, label: str) -> str:
    """Markdown: the white-box and black-box lower bounds of one recipe next to the epsilon it claims."""
    header = ["run", "audit", "canaries", "claimed epsilon", "epsilon lower bound", "correct/guesses"]
    rows = [
        [label, f"white-box (gradient canaries, {white.score} score)", white.audit.num_canaries,
         _claimed(white.claimed_epsilon), f"{white.audit.epsilon_lower_bound:.3f}",
         f"{white.audit.correct}/{white.audit.guesses}"],
        [label, "black-box (mislabeled canaries)", black.audit.num_canaries, _claimed(black.claimed_epsilon),
         f"{black.audit.epsilon_lower_bound:.3f}", f"{black.audit.correct}/{black.audit.guesses}"],
    ]  # fmt: skip
    return (
        f"{markdown_table(header, rows)}\n\nOne-run audits (Steinke, Nasr, Jagielski 2023, arXiv 2305.08846), each a "
        f"separate training run of the recipe; lower bounds at {100 * (1 - black.audit.beta):g}% confidence for "
        f"delta={black.audit.delta:g}. White-box: Dirac gradient canaries scored from every step's private gradient."
    )


def _white_box_mode(args: argparse.Namespace, device: str) -> None:
    """Both one-run audits of the config's recipe, each trained with the engine ``--engine`` names, else the one the
    config names (:func:`~lightning_dprobust.audit.white_box.audited_engine`), so that they audit that engine."""
    recipe, datamodule = load_recipe(args.config)
    recipe = _adjust(recipe, args)
    recipe = recipe.replace(dp=recipe.dp | {"engine": audited_engine(recipe, args.engine)})
    audit_args = {"beta": args.beta, "delta": args.delta, "device": device}
    white = white_box_audit(recipe, datamodule, args.gradient_canaries, seed=args.seed or 0, **audit_args)
    black = canary_audit(recipe, datamodule, args.canaries or 200, **audit_args)
    config = Path(args.config)
    summary = format_white_box_report(white, black, f"{config.parent.name}/{config.stem} ({white.engine} engine)")
    print(f"\n{summary}\n")
    print(
        f"claimed epsilon: {_claimed(white.claimed_epsilon)}; empirical lower bounds: white-box "
        f"{white.audit.epsilon_lower_bound:.3f}, black-box {black.audit.epsilon_lower_bound:.3f}"
    )
    metrics = {
        "white_box/epsilon_lower_bound": white.audit.epsilon_lower_bound,
        "white_box/claimed_epsilon": white.claimed_epsilon,
        "canary/epsilon_lower_bound": black.audit.epsilon_lower_bound,
    }
    _finish(args, run_folder(args.out, "audit", _label(args)), summary, metrics, {})


# --------------------------------------------------------------------------------------------------- membership
def format_membership_report(report: MembershipReport) -> str:
    """Markdown: one row per attack (AUC, best balanced accuracy, TPR at 0.1% and 1% FPR) and the low-FPR caveat."""
    header = ["attack", "AUC", "balanced acc", *(f"TPR@{100 * fpr:g}%FPR" for fpr in LOW_FPRS)]
    rows = [
        [name, f"{m.auc:.4f}", f"{m.balanced_accuracy:.4f}", *(f"{m.tpr_at_low_fpr[fpr]:.4f}" for fpr in LOW_FPRS)]
        for name, m in report.metrics.items()
    ]
    first = next(iter(report.metrics.values()))
    return (
        f"{markdown_table(header, rows)}\n\n{first.num_members} members vs {first.num_nonmembers} non-members, "
        f"{report.num_shadows} shadow models on a pool of {len(report.split.shadow_pool)}. "
        f"{low_fpr_note(first.num_nonmembers)}."
    )


def _shadow_recipe(args: argparse.Namespace, model: object, datamodule: object) -> Recipe:
    """``--config``, else the checkpoint's own hyperparameters, else the zoo entry's recipe."""
    from lightning_dprobust.methods.base import ClassifierModule

    if args.config is not None:
        return _adjust(load_recipe(args.config)[0], args)
    if isinstance(model, ClassifierModule):
        return _adjust(Recipe.from_module(model, datamodule, args.batch_size, args.epochs or 40), args)
    try:
        return _adjust(zoo_recipe(args.ckpt)[0], args)
    except ZooError as error:
        raise ValueError(
            f"--ckpt_path {args.ckpt}: its training recipe is unavailable ({error}); pass --config CONFIG (e.g. "
            "configs/erm/digits.yaml) so the shadow models can be trained like it"
        ) from error


def format_salem_report(report: SalemReport, split: SalemSplit, lr: float = 0.1) -> str:
    """Markdown: the protocol's AUC row, its precision and recall at each threshold, and how it was run."""
    roc = report.roc
    collapsed = (
        " The attack MLP gave every example the same score (its training collapsed): this AUC shows that it found no "
        "signal, not that the model is private; try a smaller --salem-lr."
        if report.collapsed
        else ""
    )
    header = ["attack", "AUC", "balanced acc", *(f"TPR@{100 * fpr:g}%FPR" for fpr in LOW_FPRS)]
    row = [SALEM, f"{roc.auc:.4f}", f"{roc.balanced_accuracy:.4f}", *(f"{roc.tpr_at_low_fpr[f]:.4f}" for f in LOW_FPRS)]
    thresholds = [[f"{t:g}", f"{report.precision[t]:.4f}", f"{report.recall[t]:.4f}"] for t in report.precision]
    return (
        f"{markdown_table(header, [row])}\n\n{markdown_table(['threshold', 'precision', 'recall'], thresholds)}\n\n"
        f"Salem et al. 2019 protocol of Tao et al. (section 4.1): D_target is {len(split.target_in)} members vs "
        f"{len(split.target_out)} non-members; one shadow model trained like the target on {len(split.shadow_in)} "
        f"examples, {len(split.shadow_out)} held out; top-k sorted probabilities, a k-64-2 MLP (50 epochs of Adam, lr "
        f"{lr:g}); one noisy query per example. {low_fpr_note(roc.num_nonmembers)}.{collapsed}"
    )


def _membership_mode(args: argparse.Namespace, device: str) -> None:
    from lightning_dprobust.cli.loading import load_classifier

    attacks = tuple(args.attack or ATTACKS)
    try:
        model = load_classifier(args.ckpt)
    except ZooError as error:
        raise ValueError(f"--ckpt_path {args.ckpt!r} is not a usable zoo entry or checkpoint file: {error}") from error
    datamodule = DATAMODULES[args.data](data_dir=args.data_dir, seed=args.split_seed)
    recipe = _shadow_recipe(args, model, datamodule) if {"shadow", "lira", SALEM} & set(attacks) else None
    summaries, curves, metrics = [], {}, {}
    standard = tuple(name for name in attacks if name != SALEM)
    if standard:
        report = checkpoint_membership_audit(model, datamodule, recipe, args.shadows, standard, args.seed or 0, device)
        summaries.append(format_membership_report(report))
        curves |= report.metrics
    if SALEM in attacks:
        salem, split = checkpoint_salem_audit(model, datamodule, recipe, args.seed or 0, device, lr=args.salem_lr)
        summaries.append(format_salem_report(salem, split, args.salem_lr))
        curves[SALEM] = salem.roc
        metrics |= {f"membership/{SALEM}/precision@{t:g}": value for t, value in salem.precision.items()}
        metrics |= {f"membership/{SALEM}/recall@{t:g}": value for t, value in salem.recall.items()}
    summary = "\n\n".join(summaries)
    print(f"\n{args.ckpt} on {args.data}:\n\n{summary}")
    out = run_folder(args.out, "audit", _label(args))
    title = Path(args.ckpt).stem if Path(args.ckpt).suffix == ".ckpt" else args.ckpt
    plot = plot_roc(curves, out / "roc.png", title=title)
    metrics |= {f"membership/{name}/{key}": value for name, m in curves.items() for key, value in m.summary().items()}
    _finish(args, out, summary, metrics, {"roc": plot})


def audit_command(argv: Sequence[str]) -> None:
    """``dprobust audit``: see the module docstring; writes ``<out>/audit.md`` (and ``roc.png``) and logs to W&B."""
    args = _parser().parse_args(argv)
    _check(args)
    device = str(resolve_device(args.device))
    if args.white_box:
        _white_box_mode(args, device)
    elif args.canaries is not None:
        _canary_mode(args, device)
    else:
        _membership_mode(args, device)
