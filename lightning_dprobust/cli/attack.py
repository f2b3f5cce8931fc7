"""``dprobust attack``: clean and robust accuracy of checkpoints or zoo entries under the attack suite."""

from __future__ import annotations

import argparse
import inspect
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from torch import nn
from torch.utils.data import DataLoader

from lightning_dprobust.cli.args import (
    CommandParser,
    check_common,
    check_models_fit,
    evaluation_parser,
    load_models,
    load_split,
    report_paths,
    require,
    resolve_device,
    run_folder,
    wandb_options,
)
from lightning_dprobust.robustness.reports import log_wandb, write_text

if TYPE_CHECKING:
    from torchattacks.attack import Attack

_ATTACK_ALIASES = frozenset({"MIM"})
"""Suite names that repeat another entry (``MIM`` is ``MIFGSM``), left out of ``--attack all``."""
_NEEDS_AIN = "AIN"
"""The suite's learned attack: run only when ``--ain`` names a trained AIN (``--attack all`` includes it then)."""
_ATTACK_OPTIONS = ("steps", "n_classes", "seed", "ain")
"""Command options passed to an attack builder when its signature names them."""


def _attack_parser() -> CommandParser:
    from lightning_dprobust.robustness.attacks import ATTACKS

    parser = evaluation_parser("attack", "Clean and robust accuracy of checkpoints under the attack suite.", 256)
    add = parser.add_argument
    add(
        "--attack",
        action="append",
        default=None,
        metavar="NAME",
        help=f"one of {sorted(ATTACKS)} (case-insensitive) or 'all'; repeat for several (default: PGD)",
    )
    add("--eps", type=float, default=8 / 255, help="budget in pixel units, Linf or L2 by attack (default: 8/255)")
    add("--steps", type=int, default=None, help="iterations of the attacks that take a step count")
    add(
        "--ain",
        default=None,
        metavar="AIN",
        help="trained AIN for --attack AIN: an AIN .ckpt or a zoo entry of kind attack",
    )
    return parser


def attack_names(requested: Sequence[str] | None, ain: str | None = None) -> list[str]:
    """The attack names of ``--attack`` (``PGD`` by default; ``all``: every attack that needs no extra argument, and
    AIN when ``--ain`` names a generator), upper-cased, each once; an unknown name is refused with the choices."""
    from lightning_dprobust.robustness.attacks import ATTACKS

    names: list[str] = []
    skipped = _ATTACK_ALIASES if ain else _ATTACK_ALIASES | {_NEEDS_AIN}
    for name in requested or ["PGD"]:
        chosen = [key for key in ATTACKS if key not in skipped] if name.lower() == "all" else [name.upper()]
        for key in chosen:
            if key not in ATTACKS:
                raise ValueError(f"--attack {name!r} is unknown: choose from {sorted(ATTACKS)} or 'all'")
            if key not in names:
                names.append(key)
    return names


def build_cli_attack(name: str, model: nn.Module, args: argparse.Namespace, n_classes: int) -> Attack:
    """Attack ``name`` on ``model`` at ``args.eps`` with the command's ``--steps``, ``--ain`` and its own random stream
    (derived from ``--seed`` and the name), passing only the options the attack accepts."""
    from lightning_dprobust.robustness.attacks import ATTACKS, build_attack
    from lightning_dprobust.robustness.randomness import attack_seed

    accepted = inspect.signature(ATTACKS[name]).parameters
    values = {"steps": args.steps, "n_classes": n_classes, "seed": attack_seed(args.seed, name), "ain": args.ain}
    kwargs = {key: values[key] for key in _ATTACK_OPTIONS if key in accepted and values[key] is not None}
    return build_attack(name, model, args.eps, **kwargs)


def _attack_metrics(label: str, results: dict[str, float]) -> dict[str, float]:
    """W&B keys: ``<label>/clean_acc`` and ``<label>/robust_acc/<attack>``."""
    metrics = {f"{label}/clean_acc": results["clean"]}
    metrics.update({f"{label}/robust_acc/{name}": value for name, value in results.items() if name != "clean"})
    return metrics


def attack_command(argv: Sequence[str]) -> None:
    """``dprobust attack``: clean and robust accuracy (Madry et al. 2018, https://arxiv.org/abs/1706.06083).

    For each ``--ckpt_path`` and each ``--attack``, prints and writes ``<label>/attack.md`` into a new run folder
    (``--out``, else ``runs/attack/<label>-N``) (rows ``clean`` and one
    per attack, accuracies in percent) and logs them to W&B. Attacks run independently on every example. Each attack
    draws from its own stream derived from ``--seed`` and its name (the same for every checkpoint), so PGD's random
    start is reproducible and an attack's result does not depend on which other attacks are requested.
    """
    from lightning_dprobust.robustness.attacks import format_table, robust_accuracy

    args = _attack_parser().parse_args(argv)
    check_common(args)
    require(math.isfinite(args.eps) and args.eps >= 0, "--eps", args.eps, "a finite number >= 0")
    require(args.steps is None or args.steps >= 1, "--steps", args.steps, "an integer >= 1")
    names, device = attack_names(args.attack, args.ain), resolve_device(args.device)
    require(
        _NEEDS_AIN not in names or args.ain, "--ain", args.ain, "a trained AIN (.ckpt or zoo entry) with --attack AIN"
    )
    require(_NEEDS_AIN in names or not args.ain, "--ain", args.ain, "given only with --attack AIN (or all)")
    models = load_models(args.ckpt, device)
    dataset, num_classes = load_split(args)
    check_models_fit(models, dataset, num_classes, args.data)
    out, metrics, written = run_folder(args.out, "attack", next(iter(models))), {}, []
    for label, model in models.items():
        suite = {name: build_cli_attack(name, model, args, num_classes) for name in names}
        if _NEEDS_AIN in suite:  # an AIN trained on another dataset: one line, before anything is evaluated
            suite[_NEEDS_AIN].check_fits(dataset[0][0].shape, num_classes, f"--ain {args.ain}")
        loader = DataLoader(dataset, batch_size=args.batch_size)
        results = robust_accuracy(model, loader, suite, device=device, max_examples=args.max_examples, seed=args.seed)
        table = format_table(results)
        print(f"\n{label}: {args.data}/{args.split}, eps={args.eps:g}\n\n{table}")
        written.append(write_text(table, out / label / "attack.md"))
        metrics.update(_attack_metrics(label, results))
    if args.wandb:
        written.append(log_wandb(out, "attack", vars(args), metrics, **wandb_options(args)))
    report_paths(written)
