"""``train_part`` of the torchvision-backed modules (MNIST, CIFAR-10): two disjoint, class-stratified halves of the
train split, on fake files in the official formats, so that a classifier pre-trained on the public half never saw the
private half a DP model trains on."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from fake_data import write_cifar, write_mnist

from lightning_dprobust.data.cifar10 import CIFAR10DataModule
from lightning_dprobust.data.mnist import MNISTDataModule

MODULES = {
    "mnist": (MNISTDataModule, lambda root: write_mnist(root, n_train=60)),
    "cifar10": (CIFAR10DataModule, lambda root: write_cifar(root, per_batch=12)),
}


@pytest.fixture(params=list(MODULES))
def written(request, tmp_path, monkeypatch):
    for where in ("torchvision.datasets.utils", "torchvision.datasets.cifar"):  # as torchvision's own tests do
        monkeypatch.setattr(f"{where}.check_integrity", lambda *args, **kwargs: True)
    module, write = MODULES[request.param]
    write(tmp_path)
    return module, tmp_path


def _splits(written, part: str, seed: int = 0):
    module, root = written
    data = module(data_dir=str(root), val_fraction=0.2, train_part=part, seed=seed)
    data.setup("fit")
    return data.train_set, data.val_set, data.test_set


def _labels(dataset) -> list[int]:
    return [int(dataset[i][1]) for i in range(len(dataset))]


def test_public_and_private_halves_partition_the_train_split_by_class(written):
    train, val, test = _splits(written, "all")
    public, val_public, test_public = _splits(written, "public")
    private, val_private, test_private = _splits(written, "private")
    assert not set(public.indices) & set(private.indices)
    assert sorted(public.indices + private.indices) == sorted(train.indices)
    assert abs(len(public) - len(private)) <= 1
    counts = [Counter(_labels(half)) for half in (public, private)]
    assert all(abs(counts[0][c] - counts[1][c]) <= 1 for c in range(10))  # stratified
    assert val.indices == val_public.indices == val_private.indices
    assert len(test) == len(test_public) == len(test_private)
    images = [public[i][0] for i in range(len(public))]
    assert all(torch.equal(image, public.dataset[j][0]) for image, j in zip(images, public.indices, strict=True))


def test_the_halves_are_a_deterministic_function_of_the_seed(written):
    first, _, _ = _splits(written, "public", seed=0)
    again, _, _ = _splits(written, "public", seed=0)
    other, _, _ = _splits(written, "public", seed=1)
    assert first.indices == again.indices and first.indices != other.indices


@pytest.mark.parametrize("module", [MNISTDataModule, CIFAR10DataModule])
def test_a_bad_train_part_is_refused_with_one_line(module):
    with pytest.raises(ValueError, match="train_part must be 'all', 'public' or 'private', got 'half'"):
        module(train_part="half")
