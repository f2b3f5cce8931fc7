"""certify_dataset, summarize and the CSV / markdown / PNG reports, against closed forms and hand-computed values."""

from __future__ import annotations

import csv

import matplotlib.image
import pytest
import torch
from scipy.stats import norm
from torch import nn
from torch.utils.data import TensorDataset

from lightning_dprobust.core.smoothing import ABSTAIN, Smooth
from lightning_dprobust.robustness.certify import (
    CSV_COLUMNS,
    certify_dataset,
    plot_certified_accuracy,
    summarize,
    write_csv,
    write_markdown,
)

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
SETTINGS = dict(sigma=0.5, n0=10, n=300, alpha=0.01, batch_size=64, progress=False)


class Constant(nn.Module):
    """Always votes for ``target`` among ``num_classes``, whatever the noise."""

    def __init__(self, target: int, num_classes: int) -> None:
        super().__init__()
        self.target, self.num_classes = target, num_classes

    def forward(self, x):
        logits = torch.zeros(x.shape[0], self.num_classes)
        logits[:, self.target] = 1.0
        return logits


def noisy_dataset(size: int = 40) -> TensorDataset:
    return TensorDataset(torch.rand(size, 1, 4, 4, generator=torch.Generator().manual_seed(0)), torch.arange(size) % 3)


def noisy_model() -> nn.Module:
    """A linear classifier whose votes under sigma = 0.5 noise are split, so counts depend on the noise."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(16, 3))


def test_constant_classifier_gives_the_closed_form_radius_on_the_selected_examples():
    rows = certify_dataset(Constant(2, 3), noisy_dataset(50), seed=0, skip=7, max_examples=5, **SETTINGS)
    assert [row["index"] for row in rows] == [0, 7, 14, 21, 28]  # max_examples counts examples, not indices
    # All n votes for class 2: the one-sided Clopper-Pearson bound is alpha ** (1 / n).
    expected_radius = 0.5 * norm.ppf(0.01 ** (1 / 300))
    for row in rows:
        assert list(row) == list(CSV_COLUMNS)
        assert row["label"] == row["index"] % 3
        assert row["prediction"] == 2
        assert row["radius"] == pytest.approx(expected_radius, rel=1e-9)
        assert row["correct"] == int(row["label"] == 2)
        assert row["seconds"] >= 0


def test_rows_follow_one_generator_seeded_once_in_index_order():
    model, dataset = noisy_model(), noisy_dataset()
    rows = certify_dataset(model, dataset, seed=5, skip=3, max_examples=6, **SETTINGS)
    smooth, generator = Smooth(model, 3, 0.5), torch.Generator().manual_seed(5)
    expected = [smooth.certify(dataset[i][0], 10, 300, 0.01, 64, generator) for i in range(0, 18, 3)]
    assert [(row["prediction"], row["radius"]) for row in rows] == [(c.prediction, c.radius) for c in expected]
    again = certify_dataset(model, dataset, seed=5, skip=3, max_examples=6, **SETTINGS)
    other = certify_dataset(model, dataset, seed=6, skip=3, max_examples=6, **SETTINGS)
    assert [row["radius"] for row in again] == [row["radius"] for row in rows]
    assert [row["radius"] for row in other] != [row["radius"] for row in rows]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [(dict(skip=0), "skip"), (dict(max_examples=0), "max_examples"), (dict(sigma=-1.0), "sigma")],
)
def test_bad_arguments_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        certify_dataset(Constant(0, 3), noisy_dataset(), seed=0, **(SETTINGS | kwargs))


def test_multi_label_datasets_are_refused():
    dataset = TensorDataset(torch.rand(4, 1, 4, 4), torch.ones(4, 3))
    with pytest.raises(ValueError, match="one integer class label"):
        certify_dataset(Constant(0, 3), dataset, seed=0, **SETTINGS)


HAND_ROWS = [  # label, prediction, radius: correct 0.3; correct exactly 0.5; abstain; wrong 0.9; correct 1.2
    dict(index=0, label=0, prediction=0, radius=0.3, correct=1, seconds=0.1),
    dict(index=1, label=1, prediction=1, radius=0.5, correct=1, seconds=0.1),
    dict(index=2, label=2, prediction=ABSTAIN, radius=0.0, correct=0, seconds=0.1),
    dict(index=3, label=0, prediction=2, radius=0.9, correct=0, seconds=0.1),
    dict(index=4, label=3, prediction=3, radius=1.2, correct=1, seconds=0.1),
]


def test_summary_matches_the_definitions_of_cohen_and_zhai():
    summary = summarize(HAND_ROWS)
    assert summary["num_examples"] == 5
    expected = {"0": 3 / 5, "0.25": 3 / 5, "0.5": 2 / 5, "0.75": 1 / 5, "1": 1 / 5}  # radius >= r counts
    assert {key: summary[f"certified_acc@{key}"] for key in expected} == pytest.approx(expected)
    assert summary["acr"] == pytest.approx((0.3 + 0.5 + 1.2) / 5)
    one_radius = summarize(HAND_ROWS, radii=(1.1,))
    assert one_radius == pytest.approx({"num_examples": 5, "certified_acc@1.1": 0.2, "acr": 0.4})


def test_csv_round_trips_every_column(tmp_path):
    path = write_csv(HAND_ROWS, tmp_path / "sub" / "certify.csv")
    with path.open() as stream:
        reader = csv.DictReader(stream)
        assert tuple(reader.fieldnames) == CSV_COLUMNS
        back = [{key: float(value) for key, value in row.items()} for row in reader]
    assert back == HAND_ROWS


def test_markdown_lists_accuracies_in_percent_and_acr(tmp_path):
    text = write_markdown(summarize(HAND_ROWS), tmp_path / "summary.md", label="hand").read_text()
    lines = [line for line in text.splitlines() if line.startswith("|")]
    header, values = ([cell.strip() for cell in line.strip("|").split("|")] for line in (lines[0], lines[2]))
    assert header == ["model", "examples", "r=0 (%)", "r=0.25 (%)", "r=0.5 (%)", "r=0.75 (%)", "r=1 (%)", "ACR"]
    assert values == ["hand", "5", "60.00", "60.00", "40.00", "20.00", "20.00", "0.4000"]


def test_plot_writes_a_png_with_several_curves(tmp_path):
    shifted = [row | {"radius": row["radius"] / 2} for row in HAND_ROWS]
    path = plot_certified_accuracy({"a": HAND_ROWS, "b": shifted}, tmp_path / "plot.png")
    assert path.read_bytes()[:8] == PNG_MAGIC
    height, width, channels = matplotlib.image.imread(path).shape
    assert height > 100 and width > 100 and channels in (3, 4)
    with pytest.raises(ValueError, match="at least one curve"):
        plot_certified_accuracy({}, tmp_path / "empty.png")
