"""IGAMT against its baselines and ablations on the embedded synthetic EHR set (Tang 2021 thesis, Tables 4.1/4.2).

Every model is trained with DP (``strict_dp`` wiring: noise on every component that reads real data, one ledger) on
the shortened data of ``make demo-ehr`` (:data:`~lightning_dprobust.demo_ehr.SMALL_DATA`: 750 training records of 12
steps, 9 features, expected batch 64, 3 epochs, delta 1e-5, max_grad_norm 1.0, the configs' model sizes), then
synthesizes as many records as the test split holds (200) from its released artifact alone (``--mask``). The data are
scaled with the synthetic source's declared public ranges (``EHRDataModule``'s default ``scaling="public"``), so the
epsilon covers the preprocessing; every distance is in those scaled units (the ``real_train`` row gives the scale).
Reported per model, as mean +- sample std over the seeds: overall and per-feature (#0, #4, #7; 3 k-means clusters
each) Minkowski (p = 2, lower is closer) and cosine (around the real mean, higher is closer) against the real test
split, and epsilon (rdp). A second result file, ``<name>_ranks``, holds each model's rank per metric among the
models of its sigma (by the mean; the ``real_train`` and via-Dec rows are not ranked).

A seed sets the model initialization, the public draws, the DP noise and the Poisson masks (reproducibility mode) and
the k-means seed; the data and its split are the same for every seed.

Usage: ``python benchmarks/ehr_similarity.py [--seeds 0 1 2] [--sigmas 1.0 0.5 2.0] [--epochs 3] [--out FILE]``.
The first sigma runs every model of ``--models``, the extra sigmas IGAMT alone: ``--sigmas 0.5`` runs every model at
sigma 0.5. ``--sigmas none`` trains without DP (no clipping, no noise; epsilon infinite). ``--wiring thesis`` trains
the IGAMT models with ``strict_dp=False`` (noise on the critics and Dec's last layer only; its epsilon is **nominal**,
no guarantee); the baselines have one wiring and are refused with it. ``--via-decoder`` adds, for IGAMT, a row that
scores the same trained model synthesizing through Dec's own body instead of the imitator Dec_i ({G, Dec, Dec.last};
a diagnostic, not the thesis's release; DP under ``strict_dp``, which noises all of Dec). ``--loss-form thesis`` trains
the IGAMT models with the thesis text's losses (means, no mask imitation, one Dec_i step) instead of the authors' code's
(the default, :class:`~lightning_dprobust.methods.igamt.IGAMT`'s ``loss_form``). ``--latent per_step`` trains the
IGAMT models with one latent per step (the authors' code's seq2seq memory; IGAMT's ``latent``) instead of one pooled
latent per record (the default); the baselines have one latent and are refused with it. ``--models real_train
--sigmas 1`` scores real training records instead.
"""

from __future__ import annotations

import argparse
import json
import warnings
from functools import partial
from pathlib import Path

import lightning as L
from seeds import DEFAULT_SEEDS, Sweep, sweep

from lightning_dprobust.data.ehr import EHRDataModule
from lightning_dprobust.demo_ehr import SMALL_DATA
from lightning_dprobust.methods.ehr_baselines import BASELINES
from lightning_dprobust.methods.igamt import IGAMT
from lightning_dprobust.methods.igamt_losses import LOSS_FORMS
from lightning_dprobust.metrics.synthetic import similarity_report
from lightning_dprobust.metrics.synthetic_eval import evaluate_generator
from lightning_dprobust.models.ehr_release import ReleasedSynthesizer
from lightning_dprobust.models.ehr_transformer import LATENTS
from results import add_results_arguments, result_name, write_result

ABLATIONS = ("w/o_emb", "only_t_emb", "w/o_imi", "w/o_imi_var")
MODELS = tuple(BASELINES) + tuple(f"igamt_{a}" for a in ABLATIONS) + ("igamt",)
MASKS = ("threshold", "bernoulli")
"""How the synthetic masks are read off the mask head (``--mask``): observed where ``m > 1/2`` (default, the first
similarity table of docs/methods/igamt.md) or drawn with probability ``m`` (the default of
``ReleasedSynthesizer.sample``)."""
REFERENCE = "real_train"
"""Not a model: 200 real training records (records 200 s .. 200 s + 199 for seed s), the scale of a perfect one."""
WIRINGS = ("strict", "thesis")
"""IGAMT's ``strict_dp`` (``True``: noise on every component that reads real data) or the thesis's (``False``)."""
DECODER = "via_decoder:"
"""Prefix of the ``--via-decoder`` scores."""
COLUMNS = ("synthetic/minkowski", "synthetic/cosine") + tuple(
    f"synthetic/feature_{f}/{metric}" for f in (0, 4, 7) for metric in ("minkowski", "cosine")
)


def build(
    model: str,
    sigma: float | None,
    seed: int,
    wiring: str = "strict",
    loss_form: str = "authors",
    latent: str = "pooled",
) -> L.LightningModule:
    """A model of :data:`MODELS` with the configs' sizes, DP at ``sigma`` (``None``: no DP), delta 1e-5, DP draws
    seeded by ``seed``; ``wiring`` (:data:`WIRINGS`) sets IGAMT's ``strict_dp``, ``loss_form`` and ``latent`` its
    ``loss_form`` and ``latent``."""
    common = {"max_steps": SMALL_DATA["num_steps"], "noise_multiplier": sigma, "delta": 1e-5, "seed": seed}
    common["accountant"] = "rdp"
    if model in BASELINES:
        return BASELINES[model](**common)
    variant = model.removeprefix("igamt_") if model != "igamt" else "igamt"
    return IGAMT(variant=variant, strict_dp=wiring == "strict", loss_form=loss_form, latent=latent, **common)


def decoder_release(module: IGAMT) -> ReleasedSynthesizer:
    """IGAMT's release with Dec's own body in place of the imitator's: what Dec_i imitates (``--via-decoder``)."""
    release = module.release()
    release.body.load_state_dict(module.decoder.body.state_dict())
    return release


def train_and_score(
    model: str,
    sigma: float | None,
    seed: int,
    epochs: int = 3,
    mask: str = "threshold",
    wiring: str = "strict",
    via_decoder: bool = False,
    loss_form: str = "authors",
    latent: str = "pooled",
) -> dict[str, float]:
    if model == REFERENCE:
        return reference_score(seed)
    L.seed_everything(seed, verbose=False)
    module = build(model, sigma, seed, wiring, loss_form, latent)
    data = EHRDataModule(**SMALL_DATA)
    trainer = L.Trainer(
        accelerator="cpu",
        max_epochs=epochs,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
    )
    trainer.fit(module, data)
    report, _ = evaluate_generator(module.release(), data.test_set.tensors, seed=seed, mask=mask)
    epsilon = module.epsilon() if sigma is not None else float("inf")
    scores = {**{key: report[key] for key in COLUMNS}, "epsilon": epsilon}
    if wiring == "thesis" and sigma is not None:
        scores["nominal_epsilon"] = module.nominal_epsilon()
    if via_decoder and getattr(module, "imitator", None) is not None:
        report, _ = evaluate_generator(decoder_release(module), data.test_set.tensors, seed=seed, mask=mask)
        scores |= {f"{DECODER}{key}": report[key] for key in COLUMNS}
    return scores


def split_decoder_rows(label: str, result: Sweep) -> dict[str, Sweep]:
    """``result`` and, if it holds ``--via-decoder`` scores, the row of the same runs synthesizing through Dec."""
    if not any(key.startswith(DECODER) for key in result.runs[0]):
        return {label: result}
    model, sigma = label.rsplit("@", 1)
    own = [{k: v for k, v in run.items() if not k.startswith(DECODER)} for run in result.runs]
    via = [{k.removeprefix(DECODER): v for k, v in run.items() if k.startswith(DECODER)} for run in result.runs]
    epsilons = [{k: v for k, v in run.items() if k.endswith("epsilon")} for run in own]
    via = [run | epsilon for run, epsilon in zip(via, epsilons, strict=True)]
    return {label: Sweep(result.seeds, own), f"{model} via Dec@{sigma}": Sweep(result.seeds, via)}


def reference_score(seed: int) -> dict[str, float]:
    """The :data:`REFERENCE` row: real training records scored like a synthetic set (k-means seed ``seed``)."""
    data = EHRDataModule(**SMALL_DATA)
    data.setup("fit")
    data.setup("test")
    x, m = (tensor[200 * seed : 200 * (seed + 1)] for tensor in data.train_set.tensors)
    if len(x) < 200:
        raise ValueError(
            f"{REFERENCE} seed {seed} has {len(x)} of 200 training records (the split holds "
            f"{len(data.train_set.tensors[0])}): pass seeds 0 .. {len(data.train_set.tensors[0]) // 200 - 1}"
        )
    report = similarity_report(data.test_set.tensors, (x, m), seed=seed)
    return {**{key: report[key] for key in COLUMNS}, "epsilon": float("inf")}


HEADER = ["Model", "sigma", "epsilon", "Minkowski", "cosine", "#0 Mink", "#0 cos", "#4 Mink", "#4 cos", "#7 Mink",
          "#7 cos"]  # fmt: skip


def table(results: dict[str, Sweep]) -> str:
    """Markdown rows: model, sigma, epsilon, overall and per-feature Minkowski / cosine (mean +- std)."""
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * 11]
    return "\n".join(lines + ["| " + " | ".join(cells) + " |" for cells in table_cells(results)])


def table_cells(results: dict[str, Sweep]) -> list[list[str]]:
    """Rows of :data:`HEADER`."""
    rows = []
    for label, result in results.items():
        model, sigma = label.rsplit("@", 1)
        epsilon = f"{result.values('epsilon').mean():.2f}"
        if "nominal_epsilon" in result.runs[0]:
            epsilon = f"none (nominal {result.values('nominal_epsilon').mean():.2f})"
        rows.append([model, sigma, epsilon, *(result.cell(key, digits=3) for key in COLUMNS)])
    return rows


RANK_HEADER = ["Model", "sigma", *HEADER[3:]]


def ranks(results: dict[str, Sweep]) -> dict[str, dict[str, int]]:
    """Each model's rank per metric of :data:`COLUMNS` among the models of its sigma, by the mean over the seeds
    (1 = closest: lowest Minkowski, highest cosine; ties share the better rank). The :data:`REFERENCE` and
    ``--via-decoder`` rows are not models and are left out; a sigma with a single model gets no ranks."""
    by_sigma: dict[str, list[str]] = {}
    for label in results:
        model, sigma = label.rsplit("@", 1)
        if not model.startswith(REFERENCE) and " via Dec" not in model:
            by_sigma.setdefault(sigma, []).append(label)
    ranked: dict[str, dict[str, int]] = {}
    for labels in by_sigma.values():
        if len(labels) < 2:
            continue
        for label in labels:
            ranked[label] = {}
        for key in COLUMNS:
            sign = -1.0 if key.endswith("cosine") else 1.0  # a lower signed mean is closer
            means = {label: sign * results[label].values(key).mean() for label in labels}
            for label in labels:
                ranked[label][key] = 1 + sum(other < means[label] for other in means.values())
    return ranked


def rank_cells(results: dict[str, Sweep]) -> list[list[str]]:
    """Rows of :data:`RANK_HEADER`: :func:`ranks` of every ranked model."""
    rows = []
    for label, per_metric in ranks(results).items():
        model, sigma = label.rsplit("@", 1)
        rows.append([model, sigma, *(str(per_metric[key]) for key in COLUMNS)])
    return rows


def parse_sigma(text: str) -> float | None:
    """A ``--sigmas`` entry: a number >= 0, or ``none`` (no DP)."""
    if text.lower() == "none":
        return None
    sigma = float(text)
    if not sigma >= 0:
        raise argparse.ArgumentTypeError(f"a sigma is a number >= 0 or 'none', got {text!r}")
    return sigma


def row_label(model: str, sigma: float | None, wiring: str, loss_form: str = "authors", latent: str = "pooled") -> str:
    """``model[ (thesis wiring)][ (thesis losses)][ (per-step latent)]@sigma`` (``none`` without DP): a row of
    :func:`table`."""
    tags = (" (thesis wiring)" if wiring == "thesis" else "") + (" (thesis losses)" if loss_form == "thesis" else "")
    tags += " (per-step latent)" if latent == "per_step" else ""
    return f"{model}{tags}@{'none' if sigma is None else f'{sigma:g}'}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=list(DEFAULT_SEEDS))
    parser.add_argument("--sigmas", type=parse_sigma, nargs="+", default=[1.0, 0.5, 2.0], help="numbers or none")
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=(*MODELS, REFERENCE))
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--mask", default=MASKS[0], choices=MASKS, help="how masks are read (default m > 1/2)")
    parser.add_argument("--wiring", default=WIRINGS[0], choices=WIRINGS, help="IGAMT's strict_dp (default) or not")
    parser.add_argument("--loss-form", default=LOSS_FORMS[0], choices=LOSS_FORMS, help="IGAMT's losses")
    parser.add_argument("--latent", default=LATENTS[0], choices=LATENTS, help="IGAMT's latent (default pooled)")
    parser.add_argument("--via-decoder", action="store_true", help="also score IGAMT synthesizing through Dec")
    parser.add_argument("--out", default="runs/ehr_similarity.json", help="per-seed numbers (JSON)")
    add_results_arguments(parser)
    args = parser.parse_args()
    if "thesis" in (args.wiring, args.loss_form) and set(args.models) & {*BASELINES, REFERENCE}:
        parser.error(
            "--wiring / --loss-form thesis apply to the IGAMT models only: pass --models igamt igamt_w/o_imi ..."
        )
    if args.latent != "pooled" and set(args.models) & {*BASELINES, REFERENCE}:
        parser.error("--latent per_step applies to the IGAMT models only: pass --models igamt igamt_w/o_imi ...")
    warnings.filterwarnings("ignore", ".*(reproducibility mode|LeafSpec|does not have many workers|self.log).*")
    out, results = Path(args.out), {}
    out.parent.mkdir(parents=True, exist_ok=True)
    for sigma in args.sigmas:
        for model in args.models if sigma == args.sigmas[0] else ["igamt"]:
            label = row_label(model, sigma, args.wiring, args.loss_form, args.latent)
            options = {"epochs": args.epochs, "mask": args.mask, "wiring": args.wiring, "via_decoder": args.via_decoder}
            options |= {"loss_form": args.loss_form, "latent": args.latent}
            results[label] = sweep(partial(train_and_score, model, sigma, **options), args.seeds, label)
            saved = {key: {"seeds": r.seeds, "runs": r.runs} for key, r in results.items()}
            out.write_text(json.dumps(saved, indent=1))
    rows = {key: row for label, r in results.items() for key, row in split_decoder_rows(label, r).items()}
    print(table(rows))
    nominal = " (nominal: the thesis wiring gives no guarantee)" if args.wiring == "thesis" else ""
    note = (
        f"{next(iter(results.values())).note()}; {args.epochs} epochs; epsilon: mean over the seeds, at delta 1e-5 "
        f"(rdp accountant){nominal}"
    )
    print(f"\n{note}")
    tags = {"thesis_wiring": args.wiring == "thesis", "thesis_losses": args.loss_form == "thesis"}
    tags["per_step_latent"] = args.latent == "per_step"
    variant = "".join(f"_{tag}" for tag, on in (tags | {"via_decoder": args.via_decoder}).items() if on)
    write_result(
        result_name(args, f"ehr_similarity{variant}"),
        title="IGAMT against its baselines and ablations on the embedded synthetic EHR set: similarity to the real "
        "test split",
        columns=HEADER,
        rows=table_cells(rows),
        seeds=args.seeds,
        notes=f"{note}; Minkowski p = 2 (lower is closer), cosine around the real mean (higher is closer)",
        raw={key: {"seeds": r.seeds, "runs": r.runs} for key, r in results.items()},
        directory=args.results_dir,
    )
    ranked = rank_cells(rows)
    if ranked:
        print("\n| " + " | ".join(RANK_HEADER) + " |\n|" + "---|" * len(RANK_HEADER))
        print("\n".join("| " + " | ".join(cells) + " |" for cells in ranked))
        write_result(
            result_name(args, f"ehr_similarity{variant}") + "_ranks",
            title="Each model's rank per similarity metric among the models of its sigma on the embedded synthetic "
            "EHR set",
            columns=RANK_HEADER,
            rows=ranked,
            seeds=args.seeds,
            notes="rank of the mean over the seeds among the models of the same sigma (1 = closest: lowest "
            "Minkowski, highest cosine; ties share the better rank); the means are those of the similarity table",
            directory=args.results_dir,
        )


if __name__ == "__main__":
    main()
