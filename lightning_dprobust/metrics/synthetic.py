"""How similar synthetic EHRs are to real ones: the evaluation of IGAMT (Tang, "Deep Learning with Differential
Privacy and Adversarial Robustness", PhD thesis, Emory University 2021, sections 4.3.1 and 4.3.3-4.3.6).

Both data sets are ``(x, m)`` tensors ``[N, num_steps + 1, F]`` as the EHR data module yields them (synthetic ones as
the generator samples them, masks thresholded at 0.5). The thesis clusters real and synthetic records, pairs the real
and the synthetic cluster centres, and reports the **sum** of the paired centres' Minkowski distances (lower is more
similar) and the **mean** of their cosine similarities (higher is more similar), over whole records and over single
temporal features with 3 clusters. It names neither the clustering algorithm, nor the pairing, nor the Minkowski
order: here they are k-means (scikit-learn, ``n_init=10``, seeded), the Hungarian assignment (minimum total Minkowski
distance between paired centres) and ``p = 2``, all configurable.

Cosine similarity needs an origin. Preprocessed records lie in ``[0, 1]^D``, so seen from 0 any two centres point
into the positive orthant and score close to 1 whatever their structure; the thesis's negative cosines (Table 4.2)
show that its origin lay inside the data. Here the cosines are taken, by default, around the mean of the real
records (``centred=True``), so they measure whether real and synthetic centres deviate from the typical real record
in the same directions; the Minkowski distances do not depend on the origin.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.optimize import linear_sum_assignment
from scipy.spatial.distance import cdist
from scipy.stats import wasserstein_distance
from sklearn.cluster import KMeans
from sklearn.decomposition import PCA
from torch import Tensor

DEFAULT_FEATURES = (0, 4, 7)
"""The thesis's temporal features #0, #4, #7 (MIMIC-IV-ED: time, heart rate, SBP)."""


@dataclass(frozen=True)
class ClusterSimilarity:
    """Paired cluster centres and their similarity.

    Args:
        minkowski: the sum of the paired centres' Minkowski distances (0 for identical centres).
        cosine: the mean of the paired centres' cosine similarities (1 for identical centres).
        pairs: ``(real, synthetic)`` centre indices of each pair.
    """

    minkowski: float
    cosine: float
    pairs: tuple[tuple[int, int], ...]


def _as_numpy(x: Tensor | np.ndarray) -> np.ndarray:
    return x.detach().cpu().double().numpy() if isinstance(x, Tensor) else np.asarray(x, dtype=np.float64)


def record_vectors(x: Tensor | np.ndarray, m: Tensor | np.ndarray) -> np.ndarray:
    """Each record as one vector: ``x * m`` flattened (missing values count as 0, as the model sees them)."""
    return (_as_numpy(x) * (_as_numpy(m) >= 0.5)).reshape(len(x), -1)


def feature_vectors(x: Tensor | np.ndarray, m: Tensor | np.ndarray, feature: int) -> np.ndarray:
    """Each record's trajectory of temporal ``feature`` (0 where missing): ``[N, num_steps]``."""
    return (_as_numpy(x)[:, 1:, feature] * (_as_numpy(m)[:, 1:, feature] >= 0.5)).astype(np.float64)


def cluster_centres(data: np.ndarray, n_clusters: int, seed: int = 0) -> np.ndarray:
    """k-means centres of the rows of ``data``: ``[n_clusters, D]``.

    Raises:
        ValueError: if there are fewer rows than clusters.
    """
    if n_clusters < 1 or len(data) < n_clusters:
        raise ValueError(f"{len(data)} records cannot form {n_clusters} clusters: use n_clusters in [1, {len(data)}]")
    return KMeans(n_clusters=n_clusters, n_init=10, random_state=seed).fit(data).cluster_centers_


def cosine_similarity(a: np.ndarray, b: np.ndarray) -> float:
    """The cosine of the angle between ``a`` and ``b`` (0 when either is the zero vector)."""
    norms = float(np.linalg.norm(a) * np.linalg.norm(b))
    return float(a @ b) / norms if norms > 0 else 0.0


def match_centres(
    real: np.ndarray, synthetic: np.ndarray, p: float = 2.0, origin: np.ndarray | None = None
) -> ClusterSimilarity:
    """Pair the centres one to one with the least total Minkowski-``p`` distance (Hungarian algorithm).

    The result does not depend on the order of either set of centres (up to ties); ``minkowski`` is the minimum over
    all pairings of the summed distances, ``cosine`` the mean cosine similarity of those pairs, both vectors taken
    from ``origin`` (default: 0).

    Raises:
        ValueError: if the two sets differ in size or dimension, or ``p < 1`` (not a metric).
    """
    if real.shape != synthetic.shape:
        raise ValueError(f"centres of shapes {real.shape} and {synthetic.shape}: both sets need the same shape")
    if p < 1:
        raise ValueError(f"Minkowski order p={p} is not a metric: use p >= 1 (1 Manhattan, 2 Euclidean)")
    cost = cdist(real, synthetic, metric="minkowski", p=p)
    rows, cols = linear_sum_assignment(cost)
    origin = np.zeros(real.shape[1]) if origin is None else origin
    cosines = [cosine_similarity(real[i] - origin, synthetic[j] - origin) for i, j in zip(rows, cols, strict=True)]
    pairs = tuple((int(i), int(j)) for i, j in zip(rows, cols, strict=True))
    return ClusterSimilarity(float(cost[rows, cols].sum()), float(np.mean(cosines)), pairs)


def cluster_similarity(
    real: np.ndarray,
    synthetic: np.ndarray,
    n_clusters: int = 3,
    p: float = 2.0,
    seed: int = 0,
    centred: bool = True,
) -> ClusterSimilarity:
    """Cluster ``real`` and ``synthetic`` rows separately (k-means) and compare the paired centres
    (:func:`match_centres`; cosines around the mean real row when ``centred``, else around 0)."""
    origin = real.mean(axis=0) if centred else None
    return match_centres(
        cluster_centres(real, n_clusters, seed), cluster_centres(synthetic, n_clusters, seed), p, origin
    )


def similarity_report(
    real: tuple[Tensor, Tensor],
    synthetic: tuple[Tensor, Tensor],
    features: Sequence[int] = DEFAULT_FEATURES,
    n_clusters: int = 3,
    feature_clusters: int = 3,
    p: float = 2.0,
    seed: int = 0,
    centred: bool = True,
) -> dict[str, float]:
    """The thesis's numbers for one synthetic set, as a flat dict ready for ``log_dict``.

    Keys: ``synthetic/minkowski`` and ``synthetic/cosine`` (whole records, ``n_clusters`` clusters),
    ``synthetic/feature_<f>/minkowski`` and ``.../cosine`` for each of ``features`` (``feature_clusters``
    clusters); cosines are taken around the real mean when ``centred``. ``synthetic/missing_wasserstein`` and
    ``synthetic/increment_wasserstein``: the 1-Wasserstein distance between the real and the synthetic
    distributions of :func:`missing_counts` and of :func:`mean_increments`.
    """
    (x_real, m_real), (x_syn, m_syn) = real, synthetic
    overall = cluster_similarity(
        record_vectors(x_real, m_real), record_vectors(x_syn, m_syn), n_clusters, p, seed, centred
    )
    report = {"synthetic/minkowski": overall.minkowski, "synthetic/cosine": overall.cosine}
    for feature in features:
        pair = cluster_similarity(
            feature_vectors(x_real, m_real, feature),
            feature_vectors(x_syn, m_syn, feature),
            feature_clusters,
            p,
            seed,
            centred,
        )
        report[f"synthetic/feature_{feature}/minkowski"] = pair.minkowski
        report[f"synthetic/feature_{feature}/cosine"] = pair.cosine
    report["synthetic/missing_wasserstein"] = float(wasserstein_distance(missing_counts(m_real), missing_counts(m_syn)))
    report["synthetic/increment_wasserstein"] = float(
        wasserstein_distance(mean_increments(x_real, m_real), mean_increments(x_syn, m_syn))
    )
    return report


def pca_projection(
    real: tuple[Tensor, Tensor], synthetic: tuple[Tensor, Tensor], seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """Real and synthetic records (:func:`record_vectors`) in the 2-D principal plane of the **real** records."""
    pca = PCA(n_components=2, random_state=seed).fit(record_vectors(*real))
    return pca.transform(record_vectors(*real)), pca.transform(record_vectors(*synthetic))


def missing_counts(m: Tensor | np.ndarray, time_feature: int = 0) -> np.ndarray:
    """Per record: the number of mask-off temporal positions per medical feature, averaged over the features.

    All ``num_steps`` steps count (a generator decides the record's length through its masks, so padding is
    mask-off too), the time feature excepted (thesis Fig 4.8).
    """
    mask = _as_numpy(m)[:, 1:] >= 0.5
    medical = np.delete(mask, time_feature, axis=2)
    return (~medical).sum(axis=1).mean(axis=1).astype(np.float64)


def mean_increments(x: Tensor | np.ndarray, m: Tensor | np.ndarray, time_feature: int = 0) -> np.ndarray:
    """Per record: the scaled time increment averaged over its observed steps (0 for a record without one; thesis
    Fig 4.9)."""
    values = _as_numpy(x)[:, 1:, time_feature]
    observed = _as_numpy(m)[:, 1:, time_feature] >= 0.5
    counts = observed.sum(axis=1)
    return np.where(counts > 0, (values * observed).sum(axis=1) / np.maximum(counts, 1), 0.0)


def mean_trajectories(x: Tensor | np.ndarray, m: Tensor | np.ndarray, features: Sequence[int]) -> np.ndarray:
    """The mean observed value of each of ``features`` at each temporal step, ``[len(features), num_steps]`` (NaN
    at a step where no record observes the feature; thesis Fig 4.7)."""
    values = _as_numpy(x)[:, 1:, list(features)]
    observed = _as_numpy(m)[:, 1:, list(features)] >= 0.5
    counts = observed.sum(axis=0)
    with np.errstate(invalid="ignore", divide="ignore"):
        means = np.where(counts > 0, (values * observed).sum(axis=0) / counts, np.nan)
    return means.T
