"""Certify a dataset split with randomized smoothing, summarize it, and write the CSV, markdown and plot reports.

CERTIFY and certified accuracy: Cohen, Rosenfeld and Kolter (2019), "Certified Adversarial Robustness via Randomized
Smoothing", https://arxiv.org/abs/1902.02918. Average certified radius (ACR): Zhai et al. (2020), "MACER",
https://arxiv.org/abs/2001.02378. Radii are L2 distances in pixel units (docs/design.md, contract 1).
"""

from __future__ import annotations

import csv
import math
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils.data import Dataset
from tqdm.auto import tqdm

from lightning_dprobust.core.smoothing import Smooth
from lightning_dprobust.metrics import AverageCertifiedRadius, CertifiedAccuracy, certified_accuracy
from lightning_dprobust.robustness.reports import markdown_table, write_text

CSV_COLUMNS = ("index", "label", "prediction", "radius", "correct", "seconds")
"""Columns of ``certify.csv``, one row per certified example (the columns of Cohen et al.'s ``certify.py``)."""

DEFAULT_RADII = (0.0, 0.25, 0.5, 0.75, 1.0)


def certify_dataset(
    model: nn.Module,
    dataset: Dataset,
    *,
    sigma: float,
    n0: int,
    n: int,
    alpha: float,
    batch_size: int,
    seed: int,
    skip: int = 1,
    max_examples: int | None = None,
    progress: bool = True,
    num_classes: int | None = None,
    desc: str = "certify",
    rows: list[dict[str, Any]] | None = None,
) -> list[dict[str, Any]]:
    """Run :meth:`~lightning_dprobust.core.smoothing.Smooth.certify` on every ``skip``-th example of ``dataset``.

    Examples ``0, skip, 2 skip, ...`` are certified in index order, at most ``max_examples`` of them (a count, not
    an index bound).

    Reproducibility: one ``torch.Generator`` on the model's device, seeded with ``seed``, is created per call and
    shared by the certified examples in index order, as Cohen et al.'s ``certify.py`` shares one generator; nothing
    else draws from it and global random state is untouched. A row therefore depends on ``seed``, ``sigma``,
    ``n0``, ``n``, ``batch_size``, ``skip`` and the rows before it. With equal values, model, device type (and, on
    CUDA, GPU model), two calls return equal rows except ``seconds``.

    Args:
        model: maps a batch of ``[0, 1]`` inputs to logits; inputs are moved to the device of its parameters.
        dataset: indexable, ``dataset[i]`` is ``(image, label, ...)`` with a single class label.
        sigma: Gaussian noise standard deviation in pixel units.
        n0: selection draws per example.
        n: estimation draws per example.
        alpha: failure probability of each certificate.
        batch_size: noisy inputs per forward pass (it also fixes the noise draws, see ``core/smoothing.py``).
        seed: seed of the generator.
        skip: certify every ``skip``-th example.
        max_examples: stop after this many certified examples; ``None`` certifies all selected examples.
        progress: show a tqdm progress bar.
        num_classes: number of logits; inferred from one clean forward pass when ``None``.
        desc: label of the progress bar.
        rows: the list the rows are appended to as each example finishes (default: a new one), so that a caller
            interrupted mid-way (Ctrl-C) still holds the finished rows.

    Returns:
        One dict per certified example with the keys of :data:`CSV_COLUMNS`; ``prediction`` is ``-1`` and
        ``radius`` is ``0.0`` when the smoothed classifier abstains, ``correct`` is ``1`` or ``0``.

    Raises:
        ValueError: for ``skip < 1``, ``max_examples < 1``, a multi-label dataset, or an invalid smoothing argument.
    """
    indices = _selected_indices(len(dataset), skip, max_examples)
    if not indices:
        return [] if rows is None else rows
    device = _device_of(model)
    generator = torch.Generator(device=device).manual_seed(seed)
    smooth = Smooth(model, num_classes or _count_logits(model, dataset[0][0], device), sigma)
    rows = [] if rows is None else rows
    for index in tqdm(indices, desc=desc, disable=not progress, unit="example"):
        image, label = dataset[index][:2]
        label = single_label(label)
        start = time.perf_counter()
        cert = smooth.certify(image.to(device), n0, n, alpha, batch_size, generator)
        seconds = time.perf_counter() - start
        values = (index, label, cert.prediction, cert.radius, int(cert.prediction == label), seconds)
        rows.append(dict(zip(CSV_COLUMNS, values, strict=True)))
    return rows


def _selected_indices(length: int, skip: int, max_examples: int | None) -> list[int]:
    if isinstance(skip, bool) or not isinstance(skip, int) or skip < 1:
        raise ValueError(f"skip must be an integer >= 1 (certify every skip-th example), got {skip!r}")
    if max_examples is not None and (isinstance(max_examples, bool) or max_examples < 1):
        raise ValueError(f"max_examples must be None or an integer >= 1, got {max_examples!r}")
    return list(range(0, length, skip))[:max_examples]


def _device_of(model: nn.Module) -> torch.device:
    parameter = next(model.parameters(), None)
    return parameter.device if parameter is not None else torch.device("cpu")


def _count_logits(model: nn.Module, image: Tensor, device: torch.device) -> int:
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode():
            return int(model(image.unsqueeze(0).to(device)).shape[-1])
    finally:
        model.train(was_training)


def single_label(label: Any) -> int:
    """One integer class label as an ``int``; a multi-element or floating-point label is refused."""
    label = torch.as_tensor(label)
    if label.numel() != 1 or label.is_floating_point():
        raise ValueError(
            f"certification needs one integer class label per example, got a label of shape {tuple(label.shape)} "
            f"and dtype {label.dtype}: multi-label datasets cannot be certified with a single smoothed class"
        )
    return int(label)


def summarize(rows: Sequence[Mapping[str, Any]], radii: Sequence[float] = DEFAULT_RADII) -> dict[str, float]:
    """Certified accuracy at ``radii`` and ACR of certification rows, computed with the library's torchmetrics.

    Returns:
        ``{"num_examples": N, "certified_acc@<r>": ..., "acr": ...}`` with accuracies in ``[0, 1]`` (``<r>`` is the
        radius formatted with ``:g``, e.g. ``certified_acc@0.25``); values are ``nan`` without rows.
    """
    predictions, radius, targets = _certificates(rows)
    accuracy, acr = CertifiedAccuracy(radii=radii), AverageCertifiedRadius()
    accuracy.update(predictions, radius, targets)
    acr.update(predictions, radius, targets)
    summary: dict[str, float] = {"num_examples": len(rows)}
    values = accuracy.compute().reshape(-1)  # torchmetrics squeezes a single radius to a scalar
    summary.update({f"certified_acc@{r:g}": float(v) for r, v in zip(accuracy.radii, values, strict=True)})
    summary["acr"] = float(acr.compute())
    return summary


def _certificates(rows: Sequence[Mapping[str, Any]]) -> tuple[Tensor, Tensor, Tensor]:
    """Predictions, radii (float64) and labels of certification rows, as the metrics take them."""
    predictions = torch.tensor([int(row["prediction"]) for row in rows], dtype=torch.long)
    radius = torch.tensor([float(row["radius"]) for row in rows], dtype=torch.float64)
    return predictions, radius, torch.tensor([int(row["label"]) for row in rows], dtype=torch.long)


def format_summary(summaries: Mapping[str, Mapping[str, float]]) -> str:
    """A markdown table with one row per model: examples, certified accuracy (%) at each radius, and ACR.

    All summaries must come from :func:`summarize` with the same radii.
    """
    first = next(iter(summaries.values()))
    keys = [key for key in first if key.startswith("certified_acc@")]
    header = ["model", "examples", *(f"r={key.partition('@')[2]} (%)" for key in keys), "ACR"]
    rows = [
        [label, int(s["num_examples"]), *(f"{100 * s[key]:.2f}" for key in keys), f"{s['acr']:.4f}"]
        for label, s in summaries.items()
    ]
    caption = "Certified accuracy (%) at L2 radius r and average certified radius (ACR) of the smoothed classifier"
    return f"{caption}\n\n{markdown_table(header, rows)}"


def write_markdown(summary: Mapping[str, float], path: str | os.PathLike, label: str = "model") -> Path:
    """Write the :func:`format_summary` table of one model's summary to ``path``; return the path."""
    return write_text(format_summary({label: summary}), path)


def write_csv(rows: Sequence[Mapping[str, Any]], path: str | os.PathLike, columns: Sequence[str] = CSV_COLUMNS) -> Path:
    """Write rows with ``columns`` (default :data:`CSV_COLUMNS`, radius at full float precision); return the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as stream:
        writer = csv.DictWriter(stream, fieldnames=list(columns))
        writer.writeheader()
        writer.writerows(rows)
    return path


def plot_certified_accuracy(
    curves: Mapping[str, Sequence[Mapping[str, Any]]], path: str | os.PathLike, num_points: int = 256
) -> Path:
    """Plot certified accuracy against the L2 radius, one curve per model, to a PNG (Agg canvas, no pyplot state).

    Args:
        curves: certification rows by legend label.
        path: where to write the PNG.
        num_points: radii evaluated per curve, evenly spaced from 0 to the largest radius (at least 1).

    Raises:
        ValueError: if ``curves`` is empty.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    if not curves:
        raise ValueError("plot_certified_accuracy needs at least one curve")
    largest = max(
        (row["radius"] for rows in curves.values() for row in rows if math.isfinite(row["radius"])), default=0
    )
    grid = torch.linspace(0.0, max(1.0, 1.05 * largest), num_points, dtype=torch.float64)
    figure = Figure(figsize=(6, 4), dpi=120)
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    for label, rows in curves.items():
        accuracy = certified_accuracy(*_certificates(rows), radii=grid.tolist())
        axes.step(grid.numpy(), accuracy.numpy(), where="post", label=label)
    axes.set(xlabel="L2 radius (pixel units)", ylabel="certified accuracy", ylim=(0.0, 1.02), xlim=(0.0, grid[-1]))
    axes.grid(alpha=0.3)
    axes.legend()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, format="png", bbox_inches="tight")
    return path
