"""Memory and time of TransDenoiser's per-example input Jacobians (``core.transdenoiser_math.input_jacobians``).

Forward mode carries every input pixel's direction through the denoiser at once, so one example holds as many copies of
its activations as it has pixels. This script measures, for the shipped DnCNN (``configs/transdenoiser``: width 32,
depth 5, 8 groups) at MNIST (1 x 28 x 28) and CIFAR-10 (3 x 32 x 32) shapes, each slice's Jacobians of a few random
images computed ``chunk_size`` at a time: seconds and the process's peak memory above what it held before (one fresh
process per measurement, one thread, so peaks do not carry over). The default (chunk 1) is compared with the whole
batch at once on two MNIST images.

Usage: ``python benchmarks/transdenoiser_jacobians.py [--width 32] [--depth 5] [--groups 8]``.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

from results import add_results_arguments, result_name, write_result

SHAPES = {"MNIST": (1, 28, 28), "CIFAR-10": (3, 32, 32)}
CASES = (  # dataset, slice, images, chunk size
    ("MNIST", "first", 1, 1),
    ("MNIST", "last", 1, 1),
    ("CIFAR-10", "first", 1, 1),
    ("CIFAR-10", "last", 1, 1),
    ("MNIST", "first", 2, 1),
    ("MNIST", "first", 2, 2),
)
HEADER = ("dataset", "slice", "images", "chunk size", "seconds", "peak GB (extra)", "GB per image")


def measure(dataset: str, slice_name: str, images: int, chunk_size: int, width: int, depth: int, groups: int) -> dict:
    """One measurement in this process: seconds and peak resident memory (GB) above the level before the call."""
    import torch
    from torch.func import functional_call

    from lightning_dprobust.core.transdenoiser_math import input_jacobians
    from lightning_dprobust.models.dncnn import DnCNN

    torch.set_num_threads(1)
    torch.manual_seed(0)  # the denoiser's initial weights and the images: no privacy noise is drawn here
    shape = SHAPES[dataset]
    denoiser = DnCNN(shape[0], width, depth, groups)
    params = {name: p.detach() for name, p in denoiser.named_parameters()}
    sliced = {name: p for name, p in params.items() if name.startswith(f"{slice_name}.")}

    def loss(slice_params, inputs, target):
        return (functional_call(denoiser, {**params, **slice_params}, (inputs[None],)) - target[None]).pow(2).sum()

    x = torch.rand(images, *shape)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.perf_counter()
    jacobians = input_jacobians(loss, sliced, x, chunk_size=chunk_size)
    seconds = time.perf_counter() - start
    peak_gb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024 / 1e9  # ru_maxrss: KiB on Linux
    return {"seconds": seconds, "peak_gb": peak_gb, "shape": list(jacobians.shape)}


def measure_in_child(case: tuple, width: int, depth: int, groups: int) -> dict:
    """:func:`measure` in a fresh process (a process's peak memory never goes down)."""
    args = [*map(str, case), str(width), str(depth), str(groups)]
    out = subprocess.run([sys.executable, __file__, "--child", *args], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--width", type=int, default=32)
    parser.add_argument("--depth", type=int, default=5)
    parser.add_argument("--groups", type=int, default=8)
    parser.add_argument("--child", nargs=7, help=argparse.SUPPRESS)
    add_results_arguments(parser)
    args = parser.parse_args()
    if args.child:
        dataset, slice_name, *numbers = args.child
        images, chunk, width, depth, groups = map(int, numbers)
        print(json.dumps(measure(dataset, slice_name, images, chunk, width, depth, groups)))
        return
    rows, raw = [], {}
    for case in CASES:
        result = measure_in_child(case, args.width, args.depth, args.groups)
        dataset, slice_name, images, chunk = case
        raw[" ".join(map(str, case))] = result
        per_image = result["peak_gb"] / min(images, chunk)
        rows.append([dataset, slice_name, images, chunk, f"{result['seconds']:.1f}", f"{result['peak_gb']:.2f}",
                     f"{per_image:.2f}"])  # fmt: skip
        print(rows[-1], flush=True)
    write_result(
        result_name(args, "transdenoiser_jacobians"),
        title="TransDenoiser's per-example input Jacobians: seconds and peak memory on CPU",
        columns=HEADER,
        rows=rows,
        notes=f"DnCNN width {args.width}, depth {args.depth}, {args.groups} groups (the shipped recipes'); random "
        "images; one fresh process per row, one thread; peak: the process's maximum resident memory above its level "
        "before the call; GB per image: the peak over the images differentiated at once (chunk size)",
        raw=raw,
        directory=args.results_dir,
    )


if __name__ == "__main__":
    main()
