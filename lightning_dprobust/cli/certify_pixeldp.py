"""``dprobust certify --method pixeldp``: PixelDP verified inference (Lecuyer et al. 2019; Phan et al. 2020, Alg. 3).

For checkpoints whose module implements :class:`~lightning_dprobust.robustness.pixeldp.PixelDPMechanism` (StoBatch).
Each ``--attack`` crafts adversarial inputs of size ``mu_a`` against the module's ``forward`` (whatever noise it
includes), one run per ``--mu_a``; ``clean`` certifies the unattacked inputs at every ``--mu_a``. Reported, as in
Phan et al. (2020, Sec. 4): conventional accuracy (correct predictions) and certified accuracy (correct and radius
``>= mu_a``), under each attack.
"""

from __future__ import annotations

import argparse
from typing import Any

import torch
from torch import Tensor, nn

from lightning_dprobust.cli.args import (
    CommandParser,
    check_models_fit,
    load_models,
    load_split,
    report_paths,
    require,
    resolve_device,
    run_folder,
    wandb_options,
)
from lightning_dprobust.core.pixeldp import BOUNDS, CONDITIONS
from lightning_dprobust.robustness.certify import single_label, write_csv
from lightning_dprobust.robustness.reports import log_wandb, markdown_table, write_text

DEFAULT_N = 1000
DEFAULT_MU_A = (0.0, 0.05, 0.1, 0.2)
"""Attack sizes in ``[0, 1]`` pixel units (the paper's ``[-1, 1]`` sizes are twice these)."""
COLUMNS = ("index", "label", "attack", "mu_a", "prediction", "epsilon_r", "radius", "correct")
"""Columns of ``pixeldp.csv``: one row per example and (attack, attack size); ``clean`` rows have ``mu_a = 0`` (an
example is certified at ``mu`` when it is correct and ``radius >= mu``)."""
_COHEN_ONLY = ("sigma", "n0", "alpha", "denoiser")


def add_pixeldp_flags(parser: argparse.ArgumentParser) -> None:
    """The flags of ``--method pixeldp``; each defaults to ``None`` so that ``--method cohen`` can refuse them."""
    group = parser.add_argument_group("--method pixeldp")
    add = group.add_argument
    add("--eta", type=float, default=None, help="failure probability of each certificate (default: 0.05)")
    add("--bound", choices=BOUNDS, default=None, help="confidence bounds (default: clopper_pearson on argmax counts)")
    add("--condition", choices=CONDITIONS, default=None, help="robustness condition (default: paper)")
    add(
        "--psi", type=float, default=None, help="fresh-noise shrink factor for --condition strict (default: the ckpt's)"
    )
    group.add_argument(
        "--mu_a", "--mu-a", dest="mu_a", type=float, action="append", default=None,
        help="attack size in [0, 1] units; repeat",
    )  # fmt: skip
    if isinstance(parser, CommandParser):
        parser.deprecated["--mu-a"] = "--mu_a"
    add("--attack", action="append", default=None, metavar="NAME", help="attack crafted at each --mu_a; repeat")
    add("--steps", type=int, default=None, help="iterations of the attacks that take a step count")


def pixeldp_flags_given(args: argparse.Namespace) -> list[str]:
    """The ``--method pixeldp`` flags present on the command line."""
    names = ("eta", "bound", "condition", "psi", "mu_a", "attack", "steps")
    return [f"--{name}" for name in names if getattr(args, name) is not None]


def check_pixeldp(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    """Fill the defaults of ``--method pixeldp`` and refuse bad values and the flags of ``--method cohen``."""
    if given := [f"--{name}" for name in _COHEN_ONLY if getattr(args, name) != parser.get_default(name)]:
        raise ValueError(f"{', '.join(given)}: only with --method cohen (leave them out with --method pixeldp)")
    args.n = DEFAULT_N if args.n is None else args.n
    args.eta = 0.05 if args.eta is None else args.eta
    args.bound, args.condition = args.bound or "clopper_pearson", args.condition or "paper"
    args.mu_a = args.mu_a or list(DEFAULT_MU_A)
    require(args.n >= 1, "--n", args.n, "an integer >= 1")
    require(args.skip >= 1, "--skip", args.skip, "an integer >= 1")
    require(0 < args.eta < 1, "--eta", args.eta, "in (0, 1)")
    require(args.psi is None or args.psi >= 1, "--psi", args.psi, "a number >= 1")
    require(all(mu >= 0 for mu in args.mu_a), "--mu_a", args.mu_a, "numbers >= 0 (attack sizes in [0, 1] units)")
    require(args.steps is None or args.steps >= 1, "--steps", args.steps, "an integer >= 1")


def pixeldp_command(args: argparse.Namespace) -> None:
    """Certify each ``--ckpt`` (checked flags, see :func:`check_pixeldp`); write ``<out>/<label>/pixeldp.csv`` and
    ``<out>/<label>/summary.md``, print the tables and log them to W&B unless ``--no-wandb``."""
    attacks = ["clean", *_linf_attacks(args.attack)] if args.attack else ["clean"]
    models = _mechanisms(args.ckpt, resolve_device(args.device))
    psi = {label: _psi(model, args) for label, model in models.items()}
    dataset, num_classes = load_split(args)
    check_models_fit(models, dataset, num_classes, args.data)
    indices = list(range(0, len(dataset), args.skip))[: args.max_examples]
    x = torch.stack([dataset[i][0] for i in indices])
    y = torch.tensor([single_label(dataset[i][1]) for i in indices])
    out, metrics, written = run_folder(args.out, "certify", next(iter(models))), {}, []
    for label, model in models.items():
        rows, summary = _certify_model(model, psi[label], x, y, indices, attacks, args, num_classes)
        table = _table(summary)
        print(f"\n{label}: {args.data}/{args.split}, {_settings(args, model, psi[label])}\n\n{table}")
        written += [
            write_csv(rows, out / label / "pixeldp.csv", COLUMNS),
            write_text(table, out / label / "summary.md"),
        ]
        metrics.update({f"{label}/{key}": value for key, value in summary.items()})
    if args.wandb:
        written.append(log_wandb(out, "certify", vars(args), metrics, **wandb_options(args)))
    report_paths(written)


def _linf_attacks(requested: list[str]) -> list[str]:
    """The suite names of ``--attack``; only l_inf attacks with a budget can be certified against a radius."""
    from lightning_dprobust.cli.attack import attack_names
    from lightning_dprobust.robustness.attacks import L2_ATTACKS

    names = attack_names(requested)
    if unbounded := [name for name in names if name in L2_ATTACKS or name in ("CW", "AIN")]:
        raise ValueError(
            f"--attack {', '.join(unbounded)}: not a gradient l_inf attack of size --mu-a that this command crafts; "
            "choose FGSM, PGD, BIM, MIM or AutoAttack"
        )
    return names


def _mechanisms(sources: list[str], device: torch.device) -> dict[str, nn.Module]:
    from lightning_dprobust.robustness.pixeldp import PixelDPMechanism

    models = load_models(sources, device)
    for model, source in zip(models.values(), sources, strict=True):
        if not isinstance(model, PixelDPMechanism):
            raise ValueError(
                f"--ckpt_path {source}: {type(model).__name__} does not implement PixelDPMechanism (pixeldp_scores, "
                "pixeldp_radius_scale, pixeldp_attack_norm); --method pixeldp certifies models that inject their own "
                "DP noise, such as StoBatch: use --method cohen for the others"
            )
    return models


def _psi(model: nn.Module, args: argparse.Namespace) -> float:
    """The shrink factor of ``--condition strict``: ``--psi``, else the checkpoint's ``psi`` hyper-parameter."""
    if args.condition == "paper":
        return 1.0
    saved = (getattr(model, "hparams", None) or {}).get("psi")
    if args.psi is not None and saved is not None and args.psi != saved:
        raise ValueError(f"--psi {args.psi} differs from the checkpoint's psi={saved}: leave --psi out")
    if args.psi is None and saved is None:
        raise ValueError("--condition strict needs the fresh-noise shrink factor: pass --psi (1 if not shrunk)")
    return float(args.psi if args.psi is not None else saved)


def _certify_model(
    model: nn.Module, psi: float, x: Tensor, y: Tensor, indices: list[int], attacks: list[str], args, classes: int
) -> tuple[list[dict[str, Any]], dict[str, float]]:
    """Certification rows and ``{"<attack>@<mu_a>/conventional_acc" | .../certified_acc: value}``."""
    from lightning_dprobust.robustness.pixeldp import certify_pixeldp, pixeldp_metrics

    options = {key: getattr(args, key) for key in ("n", "eta", "bound", "condition", "seed", "batch_size")}
    options |= {"psi": psi, "progress": args.progress}
    device = next(model.parameters()).device
    rows, summary = [], {}
    for attack in attacks:
        for mu in [0.0] if attack == "clean" else args.mu_a:
            inputs = x if attack == "clean" else _adversarial(model, attack, mu, x, y, args, classes)
            cert = certify_pixeldp(model, inputs.to(device), y.to(device), mu_a=mu, **options)
            rows += [dict(zip(COLUMNS, values, strict=True)) for values in _rows(indices, y, attack, mu, cert)]
            for size in args.mu_a if attack == "clean" else [mu]:
                values = pixeldp_metrics(cert, y, [size])
                summary[f"{attack}@{size:g}/conventional_acc"] = values["conventional_acc"]
                summary[f"{attack}@{size:g}/certified_acc"] = values[f"certified_acc@{size:g}"]
    return rows, summary


def _rows(indices: list[int], y: Tensor, attack: str, mu: float, cert) -> list[tuple]:
    columns = (cert.prediction.tolist(), cert.epsilon_r.tolist(), cert.radius.tolist(), cert.correct.int().tolist())
    return [
        (i, int(label), attack, mu, *values) for i, label, *values in zip(indices, y.tolist(), *columns, strict=True)
    ]


def _table(summary: dict[str, float]) -> str:
    """Markdown: one row per (attack, mu_a) with conventional and certified accuracy in percent."""
    keys = [key.rpartition("/")[0] for key in summary if key.endswith("/certified_acc")]
    rows = [
        [
            *key.split("@"),
            f"{100 * summary[key + '/conventional_acc']:.2f}",
            f"{100 * summary[key + '/certified_acc']:.2f}",
        ]
        for key in keys
    ]
    caption = "Conventional and certified accuracy (%) under each attack of size mu_a (l_inf, [0, 1] pixel units)"
    return f"{caption}\n\n{markdown_table(['attack', 'mu_a', 'conventional (%)', 'certified (%)'], rows)}"


def _settings(args: argparse.Namespace, model: nn.Module, psi: float) -> str:
    values = {key: getattr(args, key) for key in ("n", "eta", "bound", "condition", "seed", "batch_size")}
    values |= {"psi": psi, "radius_scale": float(model.pixeldp_radius_scale())}
    return ", ".join(
        f"{key}={value:g}" if isinstance(value, float) else f"{key}={value}" for key, value in values.items()
    )


def _adversarial(model: nn.Module, name: str, mu: float, x: Tensor, y: Tensor, args, classes: int) -> Tensor:
    """Adversarial inputs of size ``mu`` crafted against ``model``'s forward, on the attack's own random stream."""
    from lightning_dprobust.cli.attack import build_cli_attack
    from lightning_dprobust.robustness.attacks import attack_guard
    from lightning_dprobust.robustness.randomness import AttackRandomness, attack_seed

    crafting = argparse.Namespace(steps=args.steps, seed=args.seed, eps=mu, ain=None)
    attack, device = build_cli_attack(name, model, crafting, classes), next(model.parameters()).device
    attack.set_device(device)
    stream, parts = AttackRandomness(attack_seed(args.seed, f"{name}@{mu:g}")), []
    with attack_guard(model):
        model.eval()
        for images, labels in zip(x.split(args.batch_size), y.split(args.batch_size), strict=True):
            parts.append(stream.run(attack, images.to(device), labels.to(device)).detach().cpu())
    return torch.cat(parts)
