"""``DigitsDataModule(train_part=...)``: two disjoint, class-stratified halves of the train split (public / private),
so that components pre-trained on one half never saw the data a DP model trains on in the other."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from lightning_dprobust.data import DigitsDataModule


def _splits(part: str, seed: int = 0):
    data = DigitsDataModule(train_part=part, seed=seed)
    data.setup("fit")
    data.setup("test")
    return data.train_set.tensors, data.val_set.tensors, data.test_set.tensors


def _examples(images: torch.Tensor, labels: torch.Tensor) -> Counter:
    """The multiset of (image, label) pairs."""
    return Counter(image.numpy().tobytes() + bytes([int(label)]) for image, label in zip(images, labels, strict=True))


def test_public_and_private_halves_partition_the_train_split_by_class():
    (x_all, y_all), val, test = _splits("all")
    (x_pub, y_pub), val_pub, test_pub = _splits("public")
    (x_priv, y_priv), val_priv, test_priv = _splits("private")
    assert len(y_pub) + len(y_priv) == len(y_all) and abs(len(y_pub) - len(y_priv)) <= 1
    assert _examples(x_pub, y_pub) + _examples(x_priv, y_priv) == _examples(x_all, y_all)  # a partition
    counts = [torch.bincount(labels, minlength=10) for labels in (y_pub, y_priv)]
    assert (counts[0] - counts[1]).abs().max() <= 1  # stratified
    for split, public, private in ((val, val_pub, val_priv), (test, test_pub, test_priv)):
        assert all(torch.equal(a, b) and torch.equal(a, c) for a, b, c in zip(split, public, private, strict=True))


def test_the_halves_are_a_deterministic_function_of_the_split_seed():
    (x0, _), _, _ = _splits("public", seed=0)
    (x0_again, _), _, _ = _splits("public", seed=0)
    (x1, _), _, _ = _splits("public", seed=1)
    assert torch.equal(x0, x0_again) and not torch.equal(x0, x1)


def test_a_bad_train_part_is_refused_with_one_line():
    with pytest.raises(ValueError, match="train_part must be 'all', 'public' or 'private', got 'half'"):
        DigitsDataModule(train_part="half")
