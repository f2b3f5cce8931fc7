"""Residual perturbation (Tao et al., ICLR 2021 submission) against DP-SGD on the embedded digits or MNIST sample.

For each row and seed: train the target on the data module's train split (members; digits: 1,293 images, mnist5k:
2,250, see :data:`DATASETS`), measure train and test
accuracy (the noise stays on at test time: one stochastic forward per image) and run the membership attacks of
:mod:`lightning_dprobust.audit.membership` (loss, Salem et al. shadow model, offline LiRA; members: the train
split, non-members: validation + test) with ``--shadows`` shadow models trained like the target. Rows: the plain
pre-activation ResNet8 (gamma = 0), Strategy I (input noise gamma / 2) and II at three gammas (En1), En5 at the
middle gamma of each, Strategy I without skip connections (``skip=False``, the paper's ablation) at two gammas, and
DP-SGD at epsilon 3 and 8 on the same ResNet8 with GroupNorm (BatchNorm cannot be clipped per example). Wall-clock
per epoch is timed on each row's first seed, in this one run.

Usage: ``OMP_NUM_THREADS=1 python benchmarks/residual_membership.py [--dataset digits|mnist5k] [--rows NAME ...]
[--seeds 0 1 2] [--epochs 20] [--shadows 2] [--out FILE]`` (``--rows``: only these rows, by their exact names).
``--patience P [--min-epochs M] [--min-delta D]`` trains each target until converged instead (see
:class:`convergence.Convergence`): at least ``M`` epochs, at most ``--epochs``, stopped once the validation accuracy
has not improved by more than ``D`` for ``P`` epochs in a row, and the weights of its best validation epoch are the
ones tested and attacked; its shadow models then train exactly that best epoch's number of epochs, under the same
schedule.
Prints one JSON line per row and seed, then a markdown table (mean +- std over seeds), and writes it with the raw rows
to ``--out``. ``--collect LOG [LOG ...]`` builds the table from the JSON lines of earlier runs (e.g. seeds run in
parallel processes) instead of training.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from dataclasses import dataclass, field

import numpy as np
import torch
from convergence import Convergence
from seeds import spread_cell

import lightning_dprobust.data
from lightning_dprobust.audit.membership import ATTACKS, model_outputs
from lightning_dprobust.audit.runner import checkpoint_membership_audit, train_classifier
from lightning_dprobust.methods import DPSGD, ResidualPerturbation
from lightning_dprobust.recipes import Recipe
from lightning_dprobust.robustness.reports import markdown_table, write_text
from results import add_results_arguments, result_name, write_result

SGD = dict(optimizer="sgd", lr=0.1, momentum=0.9, weight_decay=5e-4, lr_schedule="cosine")


@dataclass(frozen=True)
class Row:
    name: str
    module: type
    kwargs: dict
    dp: dict | None = None
    results: list = field(default_factory=list, compare=False)


def _rows() -> list[Row]:
    def rp(strategy: str, gamma: float, k: int = 1) -> dict:
        return dict(strategy=strategy, gamma=gamma, ensemble_size=k) | SGD

    rows = [Row("ResNet8 (plain, gamma 0)", ResidualPerturbation, rp("additive", 0.0))]
    rows += [Row(f"RP-I En1 gamma {g}", ResidualPerturbation, rp("additive", g)) for g in (0.25, 0.75, 1.5)]
    rows += [Row("RP-I En5 gamma 0.75", ResidualPerturbation, rp("additive", 0.75, 5))]
    rows += [Row(f"RP-II En1 gamma {g}", ResidualPerturbation, rp("multiplicative", g)) for g in (0.5, 1.0, 2.0)]
    rows += [Row("RP-II En5 gamma 1.0", ResidualPerturbation, rp("multiplicative", 1.0, 5))]
    no_skip = {"model_kwargs": {"skip": False}}
    rows += [
        Row(f"RP-I En1 gamma {g} no skip", ResidualPerturbation, rp("additive", g) | no_skip) for g in (0.25, 0.75)
    ]
    gn = dict(model="preact_resnet8", model_kwargs={"dp_compatible": True}, optimizer="adam", lr=0.005)
    for eps in (8.0, 3.0):
        dp = dict(max_grad_norm=1.0, target_epsilon=eps, delta=1e-5)
        rows.append(Row(f"DP-SGD ResNet8-GN eps {eps:g}", DPSGD, gn, dp))
    return rows


def _accuracy(model: torch.nn.Module, dataset) -> float:
    logits, labels = model_outputs(model, dataset)
    return float((logits.argmax(1) == labels).float().mean())


DATASETS = {
    "digits": ("DigitsDataModule", {}),
    "mnist5k": ("MNIST5kDataModule", {"test_fraction": 0.5}),
}
"""The data modules and their arguments: digits (1,293 train images); the MNIST sample with half its 5,000 images
held out for test, so that 2,250 train images keep the runs short and members and non-members come in about equal
numbers."""


def _recipe(row: Row, dataset: str, seed: int, epochs: int, stop: dict | None = None) -> Recipe:
    """The ``dprobust fit`` config of ``row`` on ``dataset``: batch 128, ``epochs`` epochs (the cap when ``stop`` is
    given: the arguments of a :class:`convergence.Convergence` callback on the dataset's validation split), seed
    ``seed``."""
    name, data_args = DATASETS[dataset]
    data = {"class_path": f"lightning_dprobust.data.{name}", "init_args": {"batch_size": 128, "seed": 0} | data_args}
    model = {"class_path": f"lightning_dprobust.methods.{row.module.__name__}", "init_args": dict(row.kwargs)}
    trainer = {"accelerator": "cpu", "devices": 1, "max_epochs": epochs}
    if stop is not None:
        arguments = {"data_module": name, "data_args": data_args} | stop
        trainer["callbacks"] = [{"class_path": f"{Convergence.__module__}.Convergence", "init_args": arguments}]
    return Recipe({"seed_everything": seed, "trainer": trainer, "model": model, "data": data, "dp": row.dp})


def _run(
    row: Row,
    dataset: str,
    seed: int,
    epochs: int,
    shadows: int,
    patience: int | None = None,
    min_delta: float = 0.0,
    min_epochs: int = 1,
) -> dict:
    """Train ``row``'s target (``epochs`` epochs, or until converged when ``patience`` is given: see
    :class:`convergence.Convergence`, which hands back the weights of the best validation epoch; its shadow models
    then train exactly that many epochs, under the same schedule, so they are trained like the weights attacked),
    test it and attack it."""
    name, data_args = DATASETS[dataset]
    datamodule = getattr(lightning_dprobust.data, name)(seed=0, **data_args)
    datamodule.setup("fit")
    datamodule.setup("test")
    stop = None if patience is None else {"patience": patience, "min_delta": min_delta, "min_epochs": min_epochs}
    recipe = _recipe(row, dataset, seed, epochs, stop)
    start = time.perf_counter()
    trained = train_classifier(recipe, datamodule.train_set)
    model = trained.module
    trained_epochs = int(getattr(model, "converged_epochs", epochs))
    best_epoch = int(getattr(model, "best_epoch", None) or trained_epochs)
    seconds = (time.perf_counter() - start) / trained_epochs
    if stop is not None:  # the shadows copy the kept weights' training: same cap (schedule), stopped at their epoch
        recipe = _recipe(row, dataset, seed, epochs, {"epochs": best_epoch})
    report = checkpoint_membership_audit(model, datamodule, recipe, shadows, ATTACKS, seed)
    train_acc, test_acc = _accuracy(model, datamodule.train_set), _accuracy(model, datamodule.test_set)
    result = dict(seed=seed, train_acc=train_acc, test_acc=test_acc, gap=train_acc - test_acc, epoch_s=seconds)
    result |= dict(
        epochs=trained_epochs,
        best_epoch=best_epoch,
        val_history=[round(acc, 4) for acc in getattr(model, "val_history", [])],
    )
    result |= {f"auc_{name}": metrics.auc for name, metrics in report.metrics.items()}
    result["epsilon"] = trained.epsilon if row.dp else model.ledger.nominal[0].epsilon
    return result


TABLE_HEADER = ["model", "test acc", "train-test gap", "AUC loss", "AUC shadow", "AUC LiRA", "epsilon"]
TABLE_HEADER += ["epochs", "best epoch", "seeds"]
"""``epochs``: epochs each target trained; ``best epoch``: the epoch whose weights were tested and attacked (the best
validation epoch when trained until converged, else the last)."""
TIMING_HEADER = ["model", "s / epoch", "x plain ResNet8", "x DP-SGD"]


def _table(rows: list[Row]) -> str:
    return markdown_table(TABLE_HEADER, _table_cells(rows))


def _table_cells(rows: list[Row]) -> list[list[str]]:
    lines = []
    for row in rows:
        r = row.results
        eps = r[0]["epsilon"]
        if math.isinf(eps):
            eps_cell = "none (not private)"
        else:
            eps_cell = f"{eps:.3g}" + ("" if row.dp else " (nominal)")
        keys = ("test_acc", "gap", "auc_loss", "auc_shadow", "auc_lira")
        epochs = spread_cell([x.get("epochs", math.nan) for x in r], digits=1).replace(" (1 seed)", "")
        best = [x.get("best_epoch", x.get("epochs", math.nan)) for x in r]
        best_cell = spread_cell(best, digits=1).replace(" (1 seed)", "")
        cells = [spread_cell([x[k] for x in r], digits=3) for k in keys]
        lines.append([row.name, *cells, eps_cell, epochs, best_cell, _seed_list([x["seed"] for x in r])])
    return lines


def _seed_list(seeds: list[int]) -> str:
    """``'0-7'`` for consecutive seeds, else ``'0, 2, 5'``."""
    seeds = sorted(seeds)
    if len(seeds) > 2 and seeds == list(range(seeds[0], seeds[-1] + 1)):
        return f"{seeds[0]}-{seeds[-1]}"
    return ", ".join(map(str, seeds))


def _timing(rows: list[Row]) -> str:
    """Seconds per epoch of each row's first seed, as ratios to the plain network and to the last DP-SGD row."""
    return _timing_table({row.name: row.results[0]["epoch_s"] for row in rows})


def _interleaved_timing(rows: list[Row], dataset: str, repeats: int) -> dict[str, float]:
    """Median seconds of a one-epoch fit (setup included) of each row, the fits taken in turn (every row once, then
    again, ``repeats`` times), so that every row meets the same load of a shared machine."""
    name, data_args = DATASETS[dataset]
    datamodule = getattr(lightning_dprobust.data, name)(seed=0, **data_args)
    datamodule.setup("fit")
    seconds: dict[str, list[float]] = {row.name: [] for row in rows}
    for _ in range(repeats):
        for row in rows:
            start = time.perf_counter()
            train_classifier(_recipe(row, dataset, 0, 1), datamodule.train_set)
            seconds[row.name].append(time.perf_counter() - start)
    return {row_name: float(np.median(values)) for row_name, values in seconds.items()}


def _timing_table(seconds: dict[str, float]) -> str:
    return markdown_table(TIMING_HEADER, _timing_cells(seconds))


def _timing_cells(seconds: dict[str, float]) -> list[list[str]]:
    plain = next((s for name, s in seconds.items() if name.startswith("ResNet8 (plain")), None)
    dpsgd = next((s for name, s in reversed(seconds.items()) if name.startswith("DP-SGD")), None)

    def ratio(s: float, reference: float | None) -> str:
        return f"{s / reference:.2f}" if reference else "n/a"

    return [[name, f"{s:.2f}", ratio(s, plain), ratio(s, dpsgd)] for name, s in seconds.items()]


def _collect(rows: list[Row], logs: list[str]) -> None:
    """Fill ``rows`` from the JSON lines that earlier runs printed (the first of any repeated row and seed), by seed."""
    by_name = {row.name: row for row in rows}
    for log in logs:
        for line in open(log):  # noqa: SIM115
            if line.startswith('{"row"'):
                record = json.loads(line)
                row = by_name.get(record.pop("row"))
                if row is None:
                    continue
                if record["seed"] not in {result["seed"] for result in row.results}:
                    row.results.append(record)
    for row in rows:
        row.results.sort(key=lambda result: result["seed"])
    rows[:] = [row for row in rows if row.results]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--dataset", choices=sorted(DATASETS), default="digits")
    parser.add_argument("--rows", nargs="+", metavar="NAME", help="run only the rows of these names")
    parser.add_argument("--epochs", type=int, default=20, help="epochs (the cap with --patience; default 20)")
    parser.add_argument(
        "--patience",
        type=int,
        default=None,
        help="train until converged: stop when the validation accuracy has not improved by more than --min-delta for "
        "this many epochs (never before --min-epochs), then keep the best validation epoch's weights (default: train "
        "exactly --epochs)",
    )
    parser.add_argument(
        "--min-epochs", type=int, default=10, help="with --patience: train at least this many epochs (default 10)"
    )
    parser.add_argument("--min-delta", type=float, default=0.002, help="with --patience (default 0.002: 0.2 points)")
    parser.add_argument("--shadows", type=int, default=2)
    parser.add_argument("--out", default="runs/residual_membership.md")
    parser.add_argument("--collect", nargs="+", metavar="LOG", help="tabulate the JSON lines of earlier runs")
    parser.add_argument("--timing", type=int, metavar="R", help="only time one-epoch fits, in turn, R times")
    add_results_arguments(parser)
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows = _rows()
    unknown = set(args.rows or ()) - {row.name for row in rows}
    if unknown:
        parser.error(f"--rows: unknown {sorted(unknown)}; the rows are {[row.name for row in rows]}")
    rows = [row for row in rows if not args.rows or row.name in args.rows]
    name = result_name(args, f"residual_membership_{args.dataset}")
    if args.timing:
        seconds = _interleaved_timing(rows, args.dataset, args.timing)
        print(_timing_table(seconds))
        write_result(
            f"{name}_interleaved_timing",
            title=f"Residual perturbation vs DP-SGD on {args.dataset}: seconds per one-epoch fit, fits taken in turn",
            columns=TIMING_HEADER,
            rows=_timing_cells(seconds),
            seeds=[0],
            notes=f"one run, median of {args.timing} rounds; each round fits every row once for one epoch (setup "
            "included), so every row meets the same load",
            directory=args.results_dir,
        )
        return
    if args.collect:
        _collect(rows, args.collect)
    for seed in [] if args.collect else args.seeds:
        for row in rows:
            result = _run(
                row, args.dataset, seed, args.epochs, args.shadows, args.patience, args.min_delta, args.min_epochs
            )
            row.results.append(result)
            print(json.dumps({"row": row.name} | row.results[-1]), flush=True)
    text = f"{_table(rows)}\n\nWall-clock per epoch:\n\n{_timing(rows)}\n"
    print(text)
    raw = json.dumps({row.name: row.results for row in rows}, indent=1)
    write_text(f"{text}\n<!-- raw\n{raw}\n-->\n", args.out)
    seeds = sorted({result["seed"] for row in rows for result in row.results})
    settings = f"{args.epochs} epochs, {args.shadows} shadow models"
    if args.patience is not None:
        settings = (
            f"trained until converged: at least {args.min_epochs} and at most {args.epochs} epochs (cosine schedule "
            f"over {args.epochs}), stopped once the validation accuracy (noise on) had not improved by more than "
            f"{100 * args.min_delta:g} points for {args.patience} epochs in a row; the weights tested and attacked are "
            "those of the epoch with the best validation accuracy (best epoch); each shadow model trained as many "
            f"epochs as its target's best epoch, under the same schedule; {args.shadows} shadow models"
        )
    write_result(
        name,
        title=f"Residual perturbation vs DP-SGD on {args.dataset}: accuracy, membership-attack AUC and epsilon",
        columns=TABLE_HEADER,
        rows=_table_cells(rows),
        seeds=seeds,
        notes=f"mean +- sample standard deviation over the seeds; {settings}; members: the train split, non-members: "
        "validation + test",
        raw={row.name: row.results for row in rows},
        directory=args.results_dir,
    )
    write_result(
        f"{name}_timing",
        title=f"Residual perturbation vs DP-SGD on {args.dataset}: wall-clock per epoch",
        columns=TIMING_HEADER,
        rows=_timing_cells({row.name: row.results[0]["epoch_s"] for row in rows}),
        seeds=[row.results[0]["seed"] for row in rows][:1],
        notes="each row's first seed, in this one run (rows trained one after the other)",
        directory=args.results_dir,
    )


if __name__ == "__main__":
    main()
