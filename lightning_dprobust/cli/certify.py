"""``dprobust certify``: randomized-smoothing certification (Cohen et al. 2019) of checkpoints or zoo entries, or,
with ``--method pixeldp``, PixelDP verified inference of models that inject their own DP noise (StoBatch)."""

from __future__ import annotations

import argparse
import math
from collections.abc import Sequence
from pathlib import Path

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
)
from lightning_dprobust.cli.certify_pixeldp import (
    DEFAULT_N,
    add_pixeldp_flags,
    check_pixeldp,
    pixeldp_command,
    pixeldp_flags_given,
)
from lightning_dprobust.robustness.certify import (
    certify_dataset,
    format_summary,
    plot_certified_accuracy,
    summarize,
    write_csv,
    write_markdown,
)
from lightning_dprobust.robustness.reports import log_wandb


def _certify_parser() -> CommandParser:
    parser = evaluation_parser("certify", "Certify checkpoints with randomized smoothing (Cohen et al. 2019).", 1000)
    add = parser.add_argument
    add(
        "--method",
        choices=("cohen", "pixeldp"),
        default="cohen",
        help="randomized smoothing or PixelDP (default: cohen)",
    )
    add("--sigma", type=float, default=0.25, help="noise std in pixel units (default: 0.25)")
    add("--n0", type=int, default=100, help="selection draws per example (default: 100)")
    add("--n", type=int, default=None, help=f"estimation draws per example (default: 100000; pixeldp: {DEFAULT_N})")
    add("--alpha", type=float, default=0.001, help="failure probability (default: 0.001)")
    add("--skip", type=int, default=1, help="certify every skip-th example (default: 1)")
    add(
        "--denoiser",
        default=None,
        metavar="PATH_OR_ZOO_NAME",
        help="certify each --ckpt classifier behind this denoiser: a TransDenoiser .ckpt or a zoo denoiser entry",
    )
    add("--progress", action=argparse.BooleanOptionalAction, default=True, help="show a progress bar")
    add_pixeldp_flags(parser)
    return parser


def _check_certify(args: argparse.Namespace) -> None:
    check_common(args)
    if given := pixeldp_flags_given(args):
        raise ValueError(f"{', '.join(given)}: only with --method pixeldp (add it, or leave these flags out)")
    args.n = 100_000 if args.n is None else args.n
    require(math.isfinite(args.sigma) and args.sigma > 0, "--sigma", args.sigma, "a finite number > 0")
    require(args.n0 >= 1, "--n0", args.n0, "an integer >= 1")
    require(args.n >= 1, "--n", args.n, "an integer >= 1")
    require(0 < args.alpha < 1, "--alpha", args.alpha, "in (0, 1)")
    require(args.skip >= 1, "--skip", args.skip, "an integer >= 1")


def certify_command(argv: Sequence[str]) -> None:
    """``dprobust certify``: CERTIFY of Cohen et al. (2019, https://arxiv.org/abs/1902.02918) on each ``--ckpt``.

    With ``--denoiser`` each ``--ckpt`` classifier ``h`` is certified as ``h(g(x))`` behind that denoiser ``g``
    (TransDenoiser, Tang 2021, thesis chapter 6).

    Writes ``<out>/<label>/certify.csv`` and ``<out>/<label>/summary.md`` per checkpoint and one
    ``<out>/certified_accuracy.png`` with every checkpoint's curve, prints the summary table and the paths, and logs
    the summary and the plot to W&B (offline unless ``WANDB_MODE`` says otherwise) unless ``--no-wandb``.
    """
    parser = _certify_parser()
    args = parser.parse_args(argv)
    if args.method == "pixeldp":
        check_common(args)
        check_pixeldp(args, parser)
        return pixeldp_command(args)
    _check_certify(args)
    models = load_models(args.ckpt, resolve_device(args.device), args.denoiser)
    dataset, num_classes = load_split(args)
    check_models_fit(models, dataset, num_classes, args.data)
    out, curves, summaries, written = Path(args.out), {}, {}, []
    options = {key: getattr(args, key) for key in ("sigma", "n0", "n", "alpha", "batch_size", "seed", "skip")}
    for label, model in models.items():
        curves[label] = certify_dataset(
            model,
            dataset,
            max_examples=args.max_examples,
            progress=args.progress,
            num_classes=num_classes,
            desc=label,
            **options,
        )
        summaries[label] = summarize(curves[label])
        written.append(write_csv(curves[label], out / label / "certify.csv"))
        written.append(write_markdown(summaries[label], out / label / "summary.md", label=label))
    plot = plot_certified_accuracy(curves, out / "certified_accuracy.png")
    settings = ", ".join(f"{key}={value}" for key, value in options.items())
    print(f"\n{args.data}/{args.split}: {settings}\n\n{format_summary(summaries)}")
    if args.wandb:
        metrics = {f"{label}/{key}": value for label, summary in summaries.items() for key, value in summary.items()}
        written.append(log_wandb(out, "certify", vars(args), metrics, {"certified_accuracy": plot}))
    report_paths([*written, plot])
