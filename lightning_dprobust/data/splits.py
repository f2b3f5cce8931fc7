"""Seeded splits: a random train/validation split, a stratified train/val/test split, a split that keeps each
group (patient) in one split, and the public / private halves of a training set."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, get_args

import numpy as np
from sklearn.model_selection import train_test_split
from torch.utils.data import Dataset, Subset


def check_fraction(key: str, value: float, allow_zero: bool = False) -> None:
    """Raise ``ValueError`` unless ``value`` lies in ``(0, 1)`` (``[0, 1)`` with ``allow_zero``)."""
    low_ok = value >= 0.0 if allow_zero else value > 0.0
    if not (low_ok and value < 1.0):
        interval = "[0, 1)" if allow_zero else "(0, 1)"
        raise ValueError(f"{key} must lie in {interval}, got {value}: set --data.{key} to e.g. 0.1")


TrainPart = Literal["all", "public", "private"]
"""The type of a data module's ``train_part`` argument (:func:`train_part_indices`)."""
TRAIN_PARTS: tuple[str, ...] = get_args(TrainPart)


def check_train_part(value: str) -> str:
    """``value`` if it is one of :data:`TRAIN_PARTS`, else a ``ValueError`` saying what to pass."""
    if value not in TRAIN_PARTS:
        raise ValueError(f"train_part must be 'all', 'public' or 'private', got {value!r}")
    return value


def train_part_indices(labels: np.ndarray, part: str, seed: int) -> np.ndarray:
    """Sorted indices of ``part`` of a training set with these ``labels``: ``"all"``, or one of two disjoint halves
    (``"public"``, ``"private"``) stratified by class (scikit-learn's ``train_test_split`` with ``test_size=0.5``
    and ``random_state=seed``), so a deterministic function of ``(labels, seed)``.

    A model trained with DP on the private half may use components pre-trained on the public half (a classifier in
    front of a DP denoiser, an attack's target): its guarantee about its training set assumes every such component
    is independent of that set, which holds only when both halves come from the same labels and seed.
    """
    index = np.arange(len(labels))
    if check_train_part(part) == "all":
        return index
    public, private = train_test_split(index, test_size=0.5, stratify=labels, random_state=seed)
    return np.sort(public if part == "public" else private)


def random_split_indices(n: int, val_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Split ``range(n)`` into sorted train and validation indices, ``round(n * val_fraction)`` of them validation.

    The split is a deterministic function of ``(n, val_fraction, seed)``: the validation indices are the first ones
    of a permutation drawn by ``numpy.random.default_rng(seed)``.
    """
    check_fraction("val_fraction", val_fraction, allow_zero=True)
    n_val = int(round(n * val_fraction))
    if n_val >= n:
        raise ValueError(f"val_fraction={val_fraction} leaves no training examples out of {n}: lower it")
    order = np.random.default_rng(seed).permutation(n)
    return np.sort(order[n_val:]), np.sort(order[:n_val])


def split_dataset(dataset: Dataset, val_fraction: float, seed: int) -> tuple[Subset, Subset]:
    """Split ``dataset`` into train and validation subsets as :func:`random_split_indices` does."""
    train, val = random_split_indices(len(dataset), val_fraction, seed)  # type: ignore[arg-type]
    return Subset(dataset, train.tolist()), Subset(dataset, val.tolist())


def stratified_split_indices(
    labels: np.ndarray, test_fraction: float, val_fraction: float, seed: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Split ``range(len(labels))`` into train, validation and test indices with the class proportions of ``labels``.

    ``test_fraction`` of all examples go to the test split, then ``val_fraction`` of the rest to the validation
    split (scikit-learn's ``train_test_split`` with ``stratify``, twice, both with ``random_state=seed``), so the
    split is a deterministic function of ``(labels, test_fraction, val_fraction, seed)``.

    Raises:
        ValueError: if a fraction is not in ``(0, 1)``, or a split would get fewer examples than there are classes.
    """
    check_fraction("test_fraction", test_fraction)
    check_fraction("val_fraction", val_fraction)
    index = np.arange(len(labels))
    rest, test = train_test_split(index, test_size=test_fraction, stratify=labels, random_state=seed)
    train, val = train_test_split(rest, test_size=val_fraction, stratify=labels[rest], random_state=seed)
    return train, val, test


def split_groups(groups: Sequence[str], targets: Sequence[int], seed: int) -> list[np.ndarray]:
    """Split examples into ``len(targets) + 1`` parts so that no group (e.g. patient) is in two parts.

    The distinct groups are visited in an order drawn by ``numpy.random.default_rng(seed)``. Each goes whole into
    the first part that holds fewer than its target number of examples; once every target is met the rest form the
    last part. Each of the first parts therefore holds at least its target, exceeding it by less than the size of
    one group.

    Args:
        groups: the group of each example.
        targets: the wanted number of examples of each part but the last.
        seed: seed of the order in which groups are assigned.

    Returns:
        The sorted example indices of each part.

    Raises:
        ValueError: if a part ends up empty (too few groups for the targets).
    """
    names, group_of = np.unique(np.asarray(groups), return_inverse=True)
    sizes = np.bincount(group_of, minlength=len(names))
    part_of_group = np.empty(len(names), dtype=np.int64)
    filled = np.zeros(len(targets) + 1, dtype=np.int64)
    part = 0
    for group in np.random.default_rng(seed).permutation(len(names)):
        while part < len(targets) and filled[part] >= targets[part]:
            part += 1
        part_of_group[group] = part
        filled[part] += sizes[group]
    if (filled == 0).any():
        raise ValueError(
            f"{len(names)} groups cannot fill {len(targets) + 1} non-empty parts with targets {list(targets)}: "
            "use more data or smaller split sizes"
        )
    part_of_example = part_of_group[group_of]
    return [np.flatnonzero(part_of_example == k) for k in range(len(targets) + 1)]
