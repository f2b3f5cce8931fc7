"""DP-SGD overhead inside Lightning: per-step wall time of ``Trainer.fit`` with ``DPCallback`` against without it.

``dp_overhead.py`` times the private step's computation alone. This script times what a user's fit pays per step:
Lightning's loop, the method's ``training_step``, ``DPCallback``'s private step (clipped sum, noise, the accountant's
ledger, the hand-over of the private gradient to ``p.grad`` inside the optimizer's step) and the optimizer step.
Each fit trains ``DPSGD`` on random data of the case's shape (``dp_overhead.CASES``) for ``--warmup`` + ``--steps``
steps; a callback times each step from ``on_train_batch_start`` to ``on_train_batch_end``, and a fit's time is the
median of its steps after the warm-up. The non-private and private fits alternate ``--pairs`` times in one process,
and the report gives each one's median over the pairs and the median ratio over the pairs with its min-max. Under
``DPCallback`` the batches are Poisson samples of the case's batch size in expectation (the callback's own loader);
without it, fixed batches of that size.

``--busy`` adds what the fits' operators cost (CPU): one more non-private and one more private fit whose timed steps
each run under ``torch.profiler`` (:class:`BusyTimer`): the operators' self time per step (``dp_profile.busy_ms``) and
the ATen operator calls per step. The busy ratio is about the ratio a fit would reach if the Python, dispatch and hooks
around the operators cost nothing; it is not exact, since the profiler's bookkeeping per operator is counted in the
operators' self time (a step with more operators pays more of it). The ATen counts are exact.

Usage: ``python benchmarks/lightning_overhead.py [--cases cnn_tanh/b64 ...] [--engine ghost] [--pairs 3]
[--steps 30] [--warmup 5] [--busy] [--accelerator cpu|cuda]`` (default ``cuda`` when available; on CPU set
``OMP_NUM_THREADS`` for a fixed thread count).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import statistics
import time
import warnings

import lightning as L
import torch
from dp_overhead import CASES, spread
from dp_profile import busy_ms
from torch.profiler import ProfilerActivity, profile
from torch.utils.data import DataLoader, TensorDataset

from results import add_results_arguments, result_name, write_result


class StepTimer(L.Callback):
    """Wall-clock seconds of each training step, from batch start to batch end (on CUDA, after the device is done)."""

    def __init__(self, cuda: bool) -> None:
        self.times: list[float] = []
        self._start = 0.0
        self._cuda = cuda

    def _now(self) -> float:
        if self._cuda:
            torch.cuda.synchronize()
        return time.perf_counter()

    def on_train_batch_start(self, *args) -> None:
        self._start = self._now()

    def on_train_batch_end(self, *args) -> None:
        self.times.append(self._now() - self._start)


class BusyTimer(StepTimer):
    """Busy milliseconds and ATen operator calls of each training step (CPU): the step runs under its own
    ``torch.profiler`` session, from batch start to batch end, so data loading between steps is not counted. The
    profiler's per-operator bookkeeping is counted in the operators' self time, so busy time grows with the number of
    operators beside their arithmetic; the ATen count is exact."""

    def __init__(self) -> None:
        super().__init__(cuda=False)
        self.aten_calls: list[int] = []
        self._profiler: profile | None = None

    def on_train_batch_start(self, *args) -> None:
        self._profiler = profile(activities=[ProfilerActivity.CPU])
        with _native_stderr_silenced():
            self._profiler.__enter__()

    def on_train_batch_end(self, *args) -> None:
        with _native_stderr_silenced():
            self._profiler.__exit__(None, None, None)
        events = self._profiler.events()
        self.times.append(busy_ms(events, cuda=False) / 1000)
        self.aten_calls.append(sum(event.name.startswith("aten::") for event in events))


@contextlib.contextmanager
def _native_stderr_silenced():
    """Kineto prints two lines to the process's stderr at each profiler start and stop (one session per step here);
    this sends file descriptor 2 to ``/dev/null`` for that moment only."""
    saved = os.dup(2)
    with open(os.devnull, "w") as devnull:
        os.dup2(devnull.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)


def fit_step_ms(
    case: str,
    engine: str | None,
    steps: int,
    warmup: int,
    accelerator: str = "cpu",
    timer: StepTimer | None = None,
) -> float:
    """Median ms of a fit's steps after ``warmup`` as ``timer`` measures them (default wall time; a
    :class:`BusyTimer`: the operators' self time); ``engine=None``: no ``DPCallback`` (non-private)."""
    from lightning_dprobust.callbacks import DPCallback
    from lightning_dprobust.methods import DPSGD

    model, shape, batch_size, model_kwargs = CASES[case]
    generator = torch.Generator().manual_seed(0)
    examples = batch_size * (steps + warmup)  # one epoch of the planned steps
    data = TensorDataset(
        torch.rand(examples, *shape, generator=generator), torch.randint(0, 10, (examples,), generator=generator)
    )

    class Data(L.LightningDataModule):
        def train_dataloader(self) -> DataLoader:
            return DataLoader(data, batch_size=batch_size, shuffle=True)

    torch.manual_seed(0)
    module = DPSGD(model=model, num_classes=10, input_shape=shape, model_kwargs=model_kwargs, lr=0.01)
    timer = timer or StepTimer(accelerator == "cuda")
    callbacks = [timer]
    if engine is not None:
        callbacks.append(DPCallback(max_grad_norm=1.0, noise_multiplier=1.0, delta=1e-5, engine=engine))
    trainer = L.Trainer(
        accelerator=accelerator,
        devices=1,
        max_steps=steps + warmup,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        limit_val_batches=0,
        callbacks=callbacks,
    )
    trainer.fit(module, datamodule=Data())
    timed = timer.times[warmup:]
    if not timed:
        raise RuntimeError(f"{case}: the fit ran {len(timer.times)} steps, none after the {warmup} warm-up steps")
    return 1000 * statistics.median(timed)


def measure(
    case: str, engine: str, pairs: int, steps: int, warmup: int, accelerator: str = "cpu", busy: bool = False
) -> dict:
    """The ms per step of each non-private and private fit, alternated ``pairs`` times; with ``busy`` also the busy
    ms per step of one more fit of each (:class:`BusyTimer`)."""
    plain, private = [], []
    for _ in range(pairs):
        plain.append(fit_step_ms(case, None, steps, warmup, accelerator))
        private.append(fit_step_ms(case, engine, steps, warmup, accelerator))
    measured = {"case": case, "engine": engine, "non-DP": plain, "DP": private}
    if busy:
        for name, fit_engine in (("non-DP", None), ("DP", engine)):
            timer = BusyTimer()
            measured[f"busy {name}"] = fit_step_ms(case, fit_engine, steps, warmup, accelerator, timer)
            measured[f"ATen calls {name}"] = statistics.median(timer.aten_calls[warmup:])
    return measured


HEADER = ["case", "engine", "ms non-DP", "ms DP", "DP / non-DP, median [min-max]", "pairs of fits"]
BUSY_KEYS = ("busy non-DP", "busy DP", "ATen calls non-DP", "ATen calls DP")
BUSY_HEADER = ["busy ms non-DP", "busy ms DP", "busy DP / non-DP", "ATen calls/step non-DP", "ATen calls/step DP"]


def cells(measured: dict) -> list[str]:
    """A row of :data:`HEADER` (and of :data:`BUSY_HEADER` when the busy time was measured)."""
    plain, private = measured["non-DP"], measured["DP"]
    ratios = [p / n for p, n in zip(private, plain, strict=True)]
    median = f"{statistics.median(plain):.2f}", f"{statistics.median(private):.2f}"
    row = [measured["case"], measured["engine"], *median, spread(ratios), str(len(plain))]
    if "busy DP" in measured:
        busy_plain, busy_private = measured["busy non-DP"], measured["busy DP"]
        row += [f"{busy_plain:.2f}", f"{busy_private:.2f}", f"{busy_private / busy_plain:.2f}x"]
        row += [f"{measured['ATen calls non-DP']:.0f}", f"{measured['ATen calls DP']:.0f}"]
    return row


def line(measured: dict) -> str:
    case, engine, plain, private, ratio, pairs, *busy = cells(measured)
    text = f"{case} ({engine}): ms non-DP {plain}, DP {private}; DP / non-DP {ratio} over {pairs} pairs of fits"
    if busy:
        text += f"; busy ms non-DP {busy[0]}, DP {busy[1]}: {busy[2]}; ATen calls/step {busy[3]} vs {busy[4]}"
    return text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", nargs="+", default=["cnn_tanh/b64"], choices=[c for c in CASES if "token" not in c])
    parser.add_argument("--engine", default="ghost", choices=["ghost", "vmap", "auto"])
    parser.add_argument("--pairs", type=int, default=3, help="alternated non-private and private fits")
    parser.add_argument("--steps", type=int, default=30, help="timed steps per fit (median taken)")
    parser.add_argument("--warmup", type=int, default=5, help="untimed first steps of each fit")
    parser.add_argument("--busy", action="store_true", help="also the operators' time and count per fit step (CPU)")
    parser.add_argument(
        "--accelerator", default="cuda" if torch.cuda.is_available() else "cpu", choices=["cpu", "cuda"]
    )
    add_results_arguments(parser)
    args = parser.parse_args()
    if args.busy and args.accelerator != "cpu":
        parser.error("--busy measures the operators' CPU self time; on CUDA use dp_profile.py --device cuda")
    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    measured = []
    for case in args.cases:
        measured.append(measure(case, args.engine, args.pairs, args.steps, args.warmup, args.accelerator, args.busy))
        print(line(measured[-1]), flush=True)
    write_result(
        result_name(args, f"lightning_overhead_{args.engine}"),
        title="DP-SGD overhead inside Lightning: per-step time of Trainer.fit with DPCallback against without",
        columns=HEADER + (BUSY_HEADER if args.busy else []),
        rows=[cells(m) for m in measured],
        notes=f"one process, {args.accelerator}, CPU threads {torch.get_num_threads()}; a fit's time: median of "
        f"{args.steps} steps after {args.warmup} warm-up steps; fits alternated; ms: median over the pairs; ratio: "
        "median [min-max] over pairs"
        + (
            "; busy: the operators' self time per step (torch.profiler), median over one more fit of each"
            if args.busy
            else ""
        ),
        raw={m["case"]: {key: m[key] for key in ("non-DP", "DP", *BUSY_KEYS) if key in m} for m in measured},
        directory=args.results_dir,
    )


if __name__ == "__main__":
    main()
