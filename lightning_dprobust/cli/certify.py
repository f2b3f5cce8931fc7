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
    labels,
    load_models,
    load_split,
    report_paths,
    require,
    resolve_device,
    run_folder,
    wandb_options,
)
from lightning_dprobust.cli.certify_pixeldp import (
    DEFAULT_N,
    add_pixeldp_flags,
    check_pixeldp,
    pixeldp_command,
    pixeldp_flags_given,
)
from lightning_dprobust.cli.loading import denoiser_provenance
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
    parser._option_string_actions["--ckpt_path"].required = False  # with --denoiser: default the denoiser's classifier
    add = parser.add_argument
    add(
        "--method",
        choices=("cohen", "pixeldp"),
        default="cohen",
        help="randomized smoothing or PixelDP (default: cohen)",
    )
    add("--sigma", type=float, default=None, help="noise std in pixel units (default: 0.25, or the --denoiser's)")
    add("--n0", type=int, default=100, help="selection draws per example (default: 100)")
    add("--n", type=int, default=None, help=f"estimation draws per example (default: 100000; pixeldp: {DEFAULT_N})")
    add("--alpha", type=float, default=0.001, help="failure probability (default: 0.001)")
    add("--skip", type=int, default=1, help="certify every skip-th example (default: 1)")
    add(
        "--denoiser",
        default=None,
        metavar="PATH_OR_ZOO_NAME",
        help="certify the classifier behind this denoiser (a TransDenoiser .ckpt or a zoo denoiser entry), at the "
        "sigma it was trained for; --ckpt_path defaults to, and must be, the classifier it was trained for",
    )
    add("--progress", action=argparse.BooleanOptionalAction, default=True, help="show a progress bar")
    add_pixeldp_flags(parser)
    return parser


def _check_certify(args: argparse.Namespace) -> None:
    check_common(args)
    if given := pixeldp_flags_given(args):
        raise ValueError(f"{', '.join(given)}: only with --method pixeldp (add it, or leave these flags out)")
    args.n = 100_000 if args.n is None else args.n
    require(args.sigma is None or (math.isfinite(args.sigma) and args.sigma > 0), "--sigma", args.sigma,
            "a finite number > 0")  # fmt: skip
    require(args.n0 >= 1, "--n0", args.n0, "an integer >= 1")
    require(args.n >= 1, "--n", args.n, "an integer >= 1")
    require(0 < args.alpha < 1, "--alpha", args.alpha, "in (0, 1)")
    require(args.skip >= 1, "--skip", args.skip, "an integer >= 1")


def check_denoiser(args: argparse.Namespace) -> None:
    """With ``--denoiser``: ``--sigma`` defaults to the sigma the denoiser was trained for and may not differ from it,
    and ``--ckpt_path`` defaults to the classifier it was trained in front of and may not name another (the
    denoiser's privacy claim covers ``h(g(x))`` only for that public classifier)."""
    sigma, classifier = denoiser_provenance(args.denoiser)
    if args.sigma is not None and sigma is not None and not math.isclose(args.sigma, sigma):
        raise ValueError(
            f"--sigma {args.sigma:g} differs from the sigma={sigma:g} the --denoiser {args.denoiser} was trained for: "
            "certify it at its own sigma (leave --sigma out)"
        )
    args.sigma = sigma if args.sigma is None else args.sigma
    if not args.ckpt:
        if classifier is None:
            raise ValueError(f"--denoiser {args.denoiser} does not name its classifier: pass --ckpt_path")
        args.ckpt = [classifier]
    if classifier is not None and (other := [source for source in args.ckpt if source != classifier]):
        raise ValueError(
            f"--ckpt_path {other[0]} is not the classifier {classifier} that the --denoiser {args.denoiser} was "
            f"trained for (its privacy claim covers only that pipeline): pass --ckpt_path {classifier}, or leave it out"
        )


class Interrupted(KeyboardInterrupt):
    """Ctrl-C after some results were written: ``dprobust`` prints ``message`` in one line and exits with 130."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def certify_command(argv: Sequence[str]) -> None:
    """``dprobust certify``: CERTIFY of Cohen et al. (2019, https://arxiv.org/abs/1902.02918) on each
    ``--ckpt_path``.

    With ``--denoiser`` the classifier ``h`` is certified as ``h(g(x))`` behind that denoiser ``g`` (TransDenoiser,
    Tang 2021, thesis chapter 6), at the sigma ``g`` was trained for, and only for the classifier it was trained in
    front of.

    Writes, into a new run folder (``--out``, else ``runs/certify/<label>-N``), ``<label>/certify.csv`` and
    ``<label>/summary.md`` per checkpoint and one ``certified_accuracy.png`` with every checkpoint's curve, prints the
    summary table and the paths, and logs the summary and the plot to W&B (offline unless ``WANDB_MODE`` says
    otherwise) unless ``--no-wandb``. Ctrl-C writes the examples certified so far and raises :class:`Interrupted`.
    """
    parser = _certify_parser()
    args = parser.parse_args(argv)
    if not args.ckpt and (args.denoiser is None or args.method == "pixeldp"):
        raise ValueError("dprobust certify: --ckpt_path is required (a .ckpt or a zoo name; repeat for several)")
    if args.method == "pixeldp":
        check_common(args)
        check_pixeldp(args, parser)
        return pixeldp_command(args)
    _check_certify(args)
    device = resolve_device(args.device)
    if args.denoiser is not None:
        load_models([args.denoiser], device)  # a missing or unsafe denoiser fails here, in one line
        check_denoiser(args)
    args.sigma = 0.25 if args.sigma is None else args.sigma
    models = load_models(args.ckpt, device, args.denoiser)
    dataset, num_classes = load_split(args)
    check_models_fit(models, dataset, num_classes, args.data)
    behind = "" if args.denoiser is None else f"@{labels([args.denoiser])[0]}"  # the outputs name both models
    out, curves, summaries, written = run_folder(args.out, "certify", next(iter(models)) + behind), {}, {}, []
    options = {key: getattr(args, key) for key in ("sigma", "n0", "n", "alpha", "batch_size", "seed", "skip")}
    for label, model in models.items():
        curves[label] = []
        try:
            certify_dataset(
                model,
                dataset,
                max_examples=args.max_examples,
                progress=args.progress,
                num_classes=num_classes,
                desc=label,
                rows=curves[label],
                **options,
            )
        except KeyboardInterrupt:
            done = {name: rows for name, rows in curves.items() if rows}
            paths = [path for name, rows in done.items() for path in _write(rows, out, name, behind)]
            where = ", ".join(str(path) for path in paths if path.suffix == ".csv") or "nothing"
            count = sum(len(rows) for rows in done.values())
            raise Interrupted(f"certify interrupted: {count} certified example(s) written to {where}") from None
        summaries[label] = summarize(curves[label])
        written += _write(curves[label], out, label, behind)
    plot = plot_certified_accuracy(curves, out / "certified_accuracy.png")
    settings = ", ".join(f"{key}={value}" for key, value in options.items())
    settings += "" if args.denoiser is None else f", denoiser={args.denoiser}"
    print(f"\n{args.data}/{args.split}: {settings}\n\n{format_summary(summaries)}")
    if args.wandb:
        metrics = {f"{label}/{key}": value for label, summary in summaries.items() for key, value in summary.items()}
        images = {"certified_accuracy": plot}
        written.append(log_wandb(out, "certify", vars(args), metrics, images, **wandb_options(args)))
    report_paths([*written, plot])


def _write(rows: list[dict], out: Path, label: str, behind: str = "") -> list[Path]:
    """``<out>/<label>/certify.csv`` and ``summary.md`` of the rows certified so far; the summary names the denoiser
    (``behind``: ``@<denoiser>``) in front of the classifier ``label``."""
    return [
        write_csv(rows, out / label / "certify.csv"),
        write_markdown(summarize(rows), out / label / "summary.md", label=label + behind),
    ]
