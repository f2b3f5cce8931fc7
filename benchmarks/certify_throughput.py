"""Throughput of ``Smooth.certify`` against a straightforward port of the published CERTIFY loop.

The reference follows ``locuslab/smoothing`` (Cohen, Rosenfeld and Kolter 2019, https://arxiv.org/abs/1902.02918)
with the device taken from the input and an explicit generator: per batch it repeats ``x``, draws the noise, adds it,
classifies, copies the predictions to numpy and counts them in a Python loop; the bound is Clopper-Pearson via
``scipy.stats.beta``. Both run on the same model, inputs, ``n0``, ``n``, batch size and seeds, alternating input by
input, and must return identical certificates. Prints a markdown table of noisy samples per second (``n0 + n`` per
input over the median time per input).

Usage: ``python benchmarks/certify_throughput.py [--n 10000] [--batch-size 1000] [--repeats 5] [--device cpu]``
(``--threads``, ``--models``, ``--sigma``, ``--alpha``, ``--n0``: see ``--help``).
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from collections.abc import Callable

import numpy as np
import torch
from scipy.stats import beta, norm
from torch import nn

from lightning_dprobust.core.smoothing import ABSTAIN, Certificate, Smooth
from lightning_dprobust.models import create_model
from results import add_results_arguments, result_name, slug, write_result

MNIST_SHAPE = (1, 28, 28)
DIGITS_SHAPE = (1, 8, 8)
NUM_CLASSES = 10


def tanh_cnn() -> nn.Module:
    """The MNIST tanh CNN of Papernot et al. (2020, https://arxiv.org/abs/2007.14191) from the model registry."""
    return create_model("cnn_tanh", num_classes=NUM_CLASSES, input_shape=MNIST_SHAPE)


def linear_model() -> nn.Module:
    """A linear classifier: its forward pass is so cheap that drawing the noise and the loop around it dominate."""
    return nn.Sequential(nn.Flatten(), nn.Linear(math.prod(MNIST_SHAPE), NUM_CLASSES))


def digits_mlp() -> nn.Module:
    """The model of the digits recipes and of ``make demo`` (tanh MLP, 64 hidden units, 8x8 inputs)."""
    return create_model("mlp_tanh", num_classes=NUM_CLASSES, input_shape=DIGITS_SHAPE, hidden=64)


MODELS: dict[str, tuple[Callable[[], nn.Module], tuple[int, int, int]]] = {
    "mlp_tanh_digits": (digits_mlp, DIGITS_SHAPE),
    "cnn_tanh_mnist": (tanh_cnn, MNIST_SHAPE),
    "linear_mnist": (linear_model, MNIST_SHAPE),
}


class ReferenceSmooth:
    """Cohen et al.'s ``Smooth.certify`` as published, with the device of ``x`` and an explicit generator."""

    def __init__(self, model: nn.Module, num_classes: int, sigma: float) -> None:
        self.model, self.num_classes, self.sigma = model, num_classes, sigma

    def certify(self, x, n0, n, alpha, batch_size, generator):
        self.model.eval()
        counts_selection = self._sample_noise(x, n0, batch_size, generator)
        c_hat = counts_selection.argmax().item()
        counts_estimation = self._sample_noise(x, n, batch_size, generator)
        n_a = counts_estimation[c_hat].item()
        p_lower = beta.ppf(alpha, n_a, n - n_a + 1) if n_a > 0 else 0.0
        if p_lower < 0.5:
            return ABSTAIN, 0.0
        return c_hat, self.sigma * norm.ppf(p_lower)

    def _sample_noise(self, x, num, batch_size, generator):
        with torch.no_grad():
            counts = np.zeros(self.num_classes, dtype=int)
            for _ in range(math.ceil(num / batch_size)):
                this_batch_size = min(batch_size, num)
                num -= this_batch_size
                batch = x.repeat((this_batch_size, 1, 1, 1))
                noise = torch.randn(batch.shape, generator=generator, device=x.device, dtype=x.dtype) * self.sigma
                predictions = self.model(batch + noise).argmax(1)
                counts += self._count_arr(predictions.cpu().numpy(), self.num_classes)
            return counts

    @staticmethod
    def _count_arr(arr, length):
        counts = np.zeros(length, dtype=int)
        for idx in arr:
            counts[idx] += 1
        return counts


def _timed(fn: Callable[..., tuple[int, float]], args: tuple, device: torch.device) -> tuple[tuple[int, float], float]:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    out = fn(*args)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return out, time.perf_counter() - start


def measure(model_name: str, args: argparse.Namespace) -> dict[str, float]:
    """Certify ``args.repeats`` random inputs with both implementations, alternating which goes first.

    Returns noisy samples per second from the median time per input, and whether all certificates agreed.
    """
    device = torch.device(args.device)
    torch.manual_seed(0)
    builder, input_shape = MODELS[model_name]
    model = builder().to(device).eval()
    ours = Smooth(model, NUM_CLASSES, args.sigma)
    certifiers = {
        "reference": ReferenceSmooth(model, NUM_CLASSES, args.sigma).certify,
        "ours": lambda *a: _as_tuple(ours.certify(*a)),
    }
    times: dict[str, list[float]] = {name: [] for name in certifiers}
    identical = True
    for i in range(args.repeats + 1):  # input 0 warms up and is not timed
        x = torch.rand(input_shape, generator=torch.Generator().manual_seed(i)).to(device)
        outs = {}
        for name in sorted(certifiers, reverse=bool(i % 2)):
            gen = torch.Generator(device=device).manual_seed(1000 + i)
            outs[name], elapsed = _timed(
                certifiers[name], (x, args.n0, args.n, args.alpha, args.batch_size, gen), device
            )
            if i:
                times[name].append(elapsed)
        identical &= outs["ours"] == outs["reference"]
    samples = args.n0 + args.n
    return {name: samples / statistics.median(t) for name, t in times.items()} | {"identical": identical}


def _as_tuple(cert: Certificate) -> tuple[int, float]:
    return cert.prediction, cert.radius


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=10000, help="estimation draws per input")
    parser.add_argument("--n0", type=int, default=100, help="selection draws per input")
    parser.add_argument("--batch-size", type=int, default=1000, help="noisy inputs per forward pass")
    parser.add_argument("--repeats", type=int, default=5, help="timed inputs per model and implementation")
    parser.add_argument("--device", default="cpu", help="torch device, e.g. cpu or cuda")
    parser.add_argument("--sigma", type=float, default=0.25)
    parser.add_argument("--alpha", type=float, default=0.001)
    parser.add_argument("--models", nargs="+", choices=sorted(MODELS), default=sorted(MODELS))
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's choice)")
    add_results_arguments(parser)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(
        f"device={args.device} threads={torch.get_num_threads()} n0={args.n0} n={args.n} "
        f"batch_size={args.batch_size} repeats={args.repeats}\n"
    )
    header = ["model", "reference (samples/s)", "ours (samples/s)", "speed-up", "identical certificates"]
    print("| " + " | ".join(header) + " |")
    print("|---|---:|---:|---:|---|")
    rows, raw = [], {}
    for model_name in args.models:
        r = raw[model_name] = measure(model_name, args)
        rows.append(
            [
                model_name,
                f"{r['reference']:,.0f}",
                f"{r['ours']:,.0f}",
                f"{r['ours'] / r['reference']:.2f}x",
                "yes" if r["identical"] else "NO",
            ]
        )
        print("| " + " | ".join(rows[-1]) + " |", flush=True)
    write_result(
        result_name(args, f"certify_throughput_{slug(torch.device(args.device).type)}"),
        title="Certification throughput: Smooth.certify against a port of the published CERTIFY loop",
        columns=header,
        rows=rows,
        notes=f"one run; noisy samples per second from the median time per input over {args.repeats} inputs; "
        f"n0={args.n0}, n={args.n}, batch {args.batch_size}, sigma {args.sigma}, threads {torch.get_num_threads()}",
        raw=raw,
        device=args.device,
        directory=args.results_dir,
    )


if __name__ == "__main__":
    main()
