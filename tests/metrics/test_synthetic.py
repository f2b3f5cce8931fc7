"""Synthetic-data similarity: cluster pairing, Minkowski and cosine, histograms, trajectories and the PNG pictures."""

from __future__ import annotations

import itertools
import time

import numpy as np
import pytest
import torch

from lightning_dprobust.data.ehr import EHRDataModule
from lightning_dprobust.data.ehr_records import encode
from lightning_dprobust.data.ehr_synthetic import synthetic_records
from lightning_dprobust.metrics.synthetic import (
    cluster_similarity,
    match_centres,
    mean_increments,
    mean_trajectories,
    missing_counts,
    pca_projection,
    similarity_report,
)
from lightning_dprobust.metrics.synthetic_metric import SyntheticSimilarity
from lightning_dprobust.metrics.synthetic_plots import log_synthetic_evaluation, write_synthetic_plots
from tests.helpers import read_wandb_history, wandb_run_file

PNG = b"\x89PNG\r\n\x1a\n"


def logged_rows(run_file, expected_rows: int, timeout: float = 20.0) -> dict:
    """The merged history of an offline W&B run, once its writer (which finishes after ``finish()``) has written
    ``expected_rows`` rows."""
    deadline = time.monotonic() + timeout
    while len(rows := read_wandb_history(run_file)) < expected_rows and time.monotonic() < deadline:
        time.sleep(0.2)
    return {key: value for row in rows for key, value in row.items()}


@pytest.fixture(scope="module")
def ehr() -> tuple[torch.Tensor, torch.Tensor]:
    datamodule = EHRDataModule(num_records=150)
    datamodule.setup()
    return datamodule.train_set.tensors


def test_identical_data_give_minkowski_zero_and_cosine_one(ehr):
    report = similarity_report(ehr, (ehr[0].clone(), ehr[1].clone()))
    assert set(report) >= {"synthetic/minkowski", "synthetic/cosine", "synthetic/feature_7/cosine"}
    for key, value in report.items():
        expected = 1.0 if key.endswith("cosine") else 0.0
        assert value == pytest.approx(expected, abs=1e-9), key


@pytest.mark.parametrize("p", [1.0, 2.0, 3.0])
def test_a_shifted_copy_is_at_the_shift_distance(p):
    real = np.random.default_rng(0).normal(size=(90, 5)) + np.repeat(np.eye(5)[:3] * 10, 30, axis=0)
    shift = 0.25
    result = cluster_similarity(real, real + shift, n_clusters=3, p=p)
    assert result.minkowski == pytest.approx(3 * shift * 5 ** (1 / p), rel=1e-9)
    assert result.cosine < 1.0


def test_pairing_is_invariant_to_cluster_order_and_optimal():
    rng = np.random.default_rng(1)
    real, synthetic = rng.normal(size=(4, 6)), rng.normal(size=(4, 6))
    base = match_centres(real, synthetic)
    for perm in itertools.permutations(range(4)):
        shuffled = match_centres(real[list(perm)], synthetic)
        assert shuffled.minkowski == pytest.approx(base.minkowski) and shuffled.cosine == pytest.approx(base.cosine)
    brute = min(
        sum(np.linalg.norm(real[i] - synthetic[j]) for i, j in enumerate(perm))
        for perm in itertools.permutations(range(4))
    )
    assert base.minkowski == pytest.approx(brute)


def test_pairing_beats_greedy_nearest_first():
    real, synthetic = np.array([[0.0], [1.0]]), np.array([[0.9], [2.0]])
    result = match_centres(real, synthetic, p=1)
    assert result.minkowski == pytest.approx(1.9)  # greedy would pair 1 with 0.9 first and total 2.1
    assert result.pairs == ((0, 0), (1, 1))


def test_cosine_is_the_mean_over_pairs():
    real, synthetic = np.array([[1.0, 0.0], [0.0, 3.0]]), np.array([[1.0, 1.0], [0.0, 2.0]])
    result = match_centres(real, synthetic)
    assert result.cosine == pytest.approx((np.sqrt(0.5) + 1.0) / 2)
    around = match_centres(real, synthetic, origin=np.array([1.0, 1.0]))  # (0, -1) vs (0, 0); (-1, 2) vs (-1, 1)
    assert around.cosine == pytest.approx((0.0 + 3 / np.sqrt(10)) / 2)


def test_centred_cosine_sees_a_shift_that_the_positive_orthant_hides():
    rng = np.random.default_rng(2)
    offsets = np.repeat([[0.2, 0, 0, 0], [0, 0.2, 0, 0], [-0.2, -0.2, 0, 0]], 40, axis=0)
    real = 0.5 + 0.03 * rng.normal(size=(120, 4)) + offsets
    shifted = real + 0.15
    assert cluster_similarity(real, shifted, centred=False).cosine > 0.99  # seen from 0, everything looks alike
    assert cluster_similarity(real, shifted).cosine < 0.8


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="p=0.5 is not a metric"):
        match_centres(np.zeros((2, 2)), np.ones((2, 2)), p=0.5)
    with pytest.raises(ValueError, match="same shape"):
        match_centres(np.zeros((2, 2)), np.ones((3, 2)))
    with pytest.raises(ValueError, match="2 records cannot form 3 clusters"):
        cluster_similarity(np.zeros((2, 2)), np.ones((2, 2)), n_clusters=3)


def test_per_record_statistics_on_hand_made_masks():
    m = torch.zeros(2, 4, 3)
    m[0, 1:4, 0] = 1  # record 0: 3 steps; feature 1 observed twice, feature 2 never
    m[0, 1:3, 1] = 1
    m[1, 1, :] = 1  # record 1: 1 step, everything observed
    x = torch.zeros(2, 4, 3)
    x[0, 1:4, 0] = torch.tensor([0.0, 0.3, 0.6])
    x[0, 1:3, 1] = torch.tensor([0.2, 0.4])
    np.testing.assert_allclose(missing_counts(m), [(1 + 3) / 2, (2 + 2) / 2])
    np.testing.assert_allclose(mean_increments(x, m), [0.3, 0.0])
    trajectories = mean_trajectories(x, m, [1, 2])
    np.testing.assert_allclose(trajectories[0], [0.1, 0.4, np.nan])
    assert np.isnan(trajectories[1, 1:]).all() and trajectories[1, 0] == 0.0


def test_pca_of_identical_sets_coincides(ehr):
    real, synthetic = pca_projection(ehr, ehr)
    assert real.shape == (len(ehr[0]), 2)
    np.testing.assert_allclose(real, synthetic)


def test_plots_are_written_and_logged_to_wandb(ehr, tmp_path):
    from lightning.pytorch.loggers import WandbLogger

    noisy = (ehr[0] * 0.9, ehr[1])
    images = write_synthetic_plots(ehr, noisy, tmp_path / "plots", feature_names=["time", "heart rate", "sbp"])
    assert set(images) == {"pca", "trajectories", "missing_values", "time_increments"}
    for path in images.values():
        assert open(path, "rb").read(8) == PNG
    report = similarity_report(ehr, noisy)
    logger = WandbLogger(save_dir=str(tmp_path), offline=True, project="synthetic-test")
    log_synthetic_evaluation([logger], report, images, step=0)
    logger.experiment.finish()
    run_file = wandb_run_file(tmp_path)
    logged = logged_rows(run_file, expected_rows=1 + len(images))
    assert logged["synthetic/minkowski"] == pytest.approx(report["synthetic/minkowski"])
    assert all("image" in logged[f"synthetic/{name}/_type"] for name in images)
    with pytest.raises(ValueError, match="one name per feature"):
        write_synthetic_plots(ehr, noisy, tmp_path, feature_names=["time"])


def test_a_fresh_draw_of_the_generator_beats_shuffled_marginals():
    datamodule = EHRDataModule(num_records=400)
    datamodule.setup()
    real = datamodule.test_set.tensors
    fresh = encode(synthetic_records(len(real[0]), seed=99), datamodule.schema)
    x, m = (tensor[: len(real[0])] for tensor in datamodule.train_set.tensors)
    order = torch.argsort(torch.rand(x.shape, generator=torch.Generator().manual_seed(0)), dim=0)
    shuffled = torch.gather(x, 0, order), torch.gather(m, 0, order)  # marginals kept, records torn apart
    good, bad = similarity_report(real, fresh), similarity_report(real, shuffled)
    assert good["synthetic/minkowski"] < bad["synthetic/minkowski"]
    assert good["synthetic/cosine"] > bad["synthetic/cosine"]
    assert good["synthetic/missing_wasserstein"] < bad["synthetic/missing_wasserstein"]


def test_the_metric_accumulates_batches_like_one_report(ehr):
    x, m = ehr
    noisy = (x * 0.8, m)
    metric = SyntheticSimilarity(p=1.0)
    for start in range(0, len(x), 64):
        batch = slice(start, start + 64)
        metric.update(x[batch], m[batch], noisy[0][batch], noisy[1][batch])
    expected = similarity_report(ehr, noisy, p=1.0)
    computed = metric.compute()
    assert set(computed) == set(expected)
    for key, value in expected.items():
        assert float(computed[key]) == pytest.approx(value, rel=1e-5, abs=1e-6), key
    with pytest.raises(ValueError, match="x and m must match"):
        metric.update(x[:2], m[:2, :50], x[:2], m[:2])
