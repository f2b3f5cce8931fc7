"""The pictures of IGAMT's evaluation (Tang, PhD thesis, Emory University 2021, Figs 4.5-4.9) as PNG files, and their
logging to the run's loggers (images to W&B).

Real data are drawn in blue and synthetic data in green, as in the thesis. Figures use matplotlib's Agg canvas, with
no pyplot state, so they can be written from any process.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from torch import Tensor

from lightning_dprobust.metrics.synthetic import (
    DEFAULT_FEATURES,
    mean_increments,
    mean_trajectories,
    missing_counts,
    pca_projection,
)

REAL, SYNTHETIC = ("real", "tab:blue"), ("synthetic", "tab:green")


def _figure(width: float = 5.0, height: float = 3.5) -> Any:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(width, height), dpi=120)
    FigureCanvasAgg(figure)
    return figure


def _save(figure: Any, path: str | os.PathLike) -> str:
    os.makedirs(os.path.dirname(os.fspath(path)) or ".", exist_ok=True)
    figure.savefig(path, format="png", bbox_inches="tight")
    return os.fspath(path)


def plot_pca(real: np.ndarray, synthetic: np.ndarray, path: str | os.PathLike, title: str = "PCA") -> str:
    """Scatter of 2-D projections (:func:`~lightning_dprobust.metrics.synthetic.pca_projection`); returns the path."""
    axes = (figure := _figure(4.5, 4.0)).add_subplot()
    for points, (label, colour) in ((real, REAL), (synthetic, SYNTHETIC)):
        axes.scatter(points[:, 0], points[:, 1], s=6, alpha=0.5, color=colour, label=label)
    axes.set(xlabel="PC 1", ylabel="PC 2", title=title)
    axes.legend(loc="best")
    return _save(figure, path)


def plot_trajectories(
    real: np.ndarray, synthetic: np.ndarray, names: Sequence[str], path: str | os.PathLike, title: str = ""
) -> str:
    """One panel per feature: the real and the synthetic mean trajectories (``[features, num_steps]`` each)."""
    figure = _figure(3.2 * len(names), 3.0)
    for k, name in enumerate(names):
        axes = figure.add_subplot(1, len(names), k + 1)
        for curve, (label, colour) in ((real[k], REAL), (synthetic[k], SYNTHETIC)):
            axes.plot(np.arange(1, len(curve) + 1), curve, color=colour, label=label)
        axes.set(xlabel="time step", ylabel=f"mean scaled {name}", title=name)
    figure.axes[0].legend(loc="best")
    if title:
        figure.suptitle(title)
    return _save(figure, path)


def plot_histogram(
    real: np.ndarray, synthetic: np.ndarray, path: str | os.PathLike, xlabel: str, title: str, bins: int = 30
) -> str:
    """Overlaid histograms of a per-record statistic over the real and the synthetic records (common bins)."""
    axes = (figure := _figure()).add_subplot()
    edges = np.histogram_bin_edges(np.concatenate([real, synthetic]), bins=bins)
    for values, (label, colour) in ((real, REAL), (synthetic, SYNTHETIC)):
        axes.hist(values, bins=edges, alpha=0.5, color=colour, label=label)
    axes.set(xlabel=xlabel, ylabel="records", title=title)
    axes.legend(loc="best")
    return _save(figure, path)


def write_synthetic_plots(
    real: tuple[Tensor, Tensor],
    synthetic: tuple[Tensor, Tensor],
    out_dir: str | os.PathLike,
    features: Sequence[int] = DEFAULT_FEATURES,
    feature_names: Sequence[str] | None = None,
    n_trajectories: int = 100,
    n_histogram: int = 1000,
    seed: int = 0,
) -> dict[str, str]:
    """Write the thesis's four pictures of one synthetic set into ``out_dir``; returns ``{name: path}``.

    ``pca.png`` (all records), ``trajectories.png`` (mean of ``features`` over the first ``n_trajectories`` records
    of each set), ``missing_values.png`` and ``time_increments.png`` (histograms over the first ``n_histogram``
    records of each set). ``feature_names`` label the panels (default ``feature <index>``).
    """
    out = Path(out_dir)
    names = list(feature_names) if feature_names is not None else [f"feature {f}" for f in features]
    if len(names) != len(features):
        raise ValueError(f"{len(names)} feature_names for {len(features)} features: give one name per feature")
    head = [(x[:n_trajectories], m[:n_trajectories]) for x, m in (real, synthetic)]
    sample = [(x[:n_histogram], m[:n_histogram]) for x, m in (real, synthetic)]
    return {
        "pca": plot_pca(*pca_projection(real, synthetic, seed), out / "pca.png"),
        "trajectories": plot_trajectories(
            *(mean_trajectories(x, m, features) for x, m in head), names, out / "trajectories.png"
        ),
        "missing_values": plot_histogram(
            *(missing_counts(m) for _, m in sample),
            out / "missing_values.png",
            "missing positions per feature",
            "missing values",
        ),
        "time_increments": plot_histogram(
            *(mean_increments(x, m) for x, m in sample),
            out / "time_increments.png",
            "mean scaled time increment",
            "irregular measurement times",
        ),
    }


def log_synthetic_evaluation(
    loggers: Iterable[Any], report: Mapping[str, float], images: Mapping[str, str], step: int | None = None
) -> None:
    """Log ``report`` (numbers) to every logger and the PNG ``images`` to each W&B logger as ``synthetic/<name>``.

    Call it on rank zero only (``trainer.is_global_zero``), as loggers expect.
    """
    for logger in loggers:
        logger.log_metrics(dict(report), step=step)
        if type(logger).__name__ == "WandbLogger":
            for name, path in images.items():
                logger.log_image(key=f"synthetic/{name}", images=[path], step=step)
