"""Does IGAMT learn simple marginals? A CPU-sized sanity check on toy EHR tensors with known structure.

For each seed: toy records (age and gender in step 0; a time increment and three features whose level depends on age,
gender and the step, each with its own missing rate), IGAMT trained non-privately (with the thesis's imitation losses
and with the ``strict_dp`` ones), with ``strict_dp`` at ``noise_multiplier`` 1.0, and with the thesis wiring at 1.0
(nominal epsilon); the released artifact samples as many records as the training set (Bernoulli masks). Reported
per setting, mean +- std over the seeds: the mean absolute difference between real and synthetic per-feature means
of the observed temporal values, and of the per-feature missing rates, next to those of the untrained model, and
epsilon at delta 1e-5 (pld).

Usage: ``python benchmarks/igamt_sanity.py [--seeds 0 1 2] [--epochs 8]``
"""

from __future__ import annotations

import argparse
import statistics
import warnings

import lightning as L
import torch
from seeds import spread_cell
from torch.utils.data import TensorDataset

from lightning_dprobust.methods import IGAMT
from results import add_results_arguments, result_name, write_result

F, T, N = 4, 6, 256
SIZES = dict(
    num_features=F, static_continuous=1, static_groups=(2,), max_steps=T, d_model=16, heads=2, d_ff=32,
    noise_size=8, critic_hidden=16, synthetic_batch_size=32, critic_freq_base=1, accountant="pld", delta=1e-5,
)  # fmt: skip
SETTINGS = {
    "non-DP, thesis losses": dict(noise_multiplier=None, strict_dp=False),
    "non-DP, strict_dp losses": dict(noise_multiplier=None),
    "strict_dp, sigma 1.0": dict(noise_multiplier=1.0),
    "thesis wiring, sigma 1.0": dict(noise_multiplier=1.0, strict_dp=False),
}


def toy_records(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(x, m)`` ``[n, 1 + T, F]`` with known marginals (see the module docstring)."""
    g = torch.Generator().manual_seed(seed)
    age, gender = torch.rand(n, generator=g), torch.randint(2, (n,), generator=g)
    x, m = torch.zeros(n, T + 1, F), torch.zeros(n, T + 1, F)
    x[:, 0, 0], x[torch.arange(n), 0, 1 + gender] = age, 1.0
    m[:, 0, :3] = 1.0
    steps = torch.arange(1, T + 1) / T
    x[:, 1:, 0] = 0.5 * torch.rand(n, T, generator=g)
    x[:, 1:, 1] = 0.2 + 0.5 * age[:, None] + 0.05 * torch.randn(n, T, generator=g)
    x[:, 1:, 2] = 0.6 + 0.2 * gender[:, None] + 0.05 * torch.randn(n, T, generator=g)
    x[:, 1:, 3] = 0.5 + 0.3 * torch.sin(6.0 * steps) + 0.05 * torch.randn(n, T, generator=g)
    missing = torch.tensor([0.0, 0.1, 0.3, 0.5])
    m[:, 1:] = (torch.rand(n, T, F, generator=g) >= missing).float()
    return x.clamp(0, 1) * m, m


def marginal_errors(real: tuple[torch.Tensor, torch.Tensor], synthetic: tuple[torch.Tensor, torch.Tensor]):
    """Mean |difference| of per-feature observed means and missing rates (temporal steps, features 1..)."""

    def stats(x, m):
        x, m = x[:, 1:, 1:], m[:, 1:, 1:]
        means = (x * m).sum(dim=(0, 1)) / m.sum(dim=(0, 1)).clamp(min=1)
        return means, 1 - m.mean(dim=(0, 1))

    (mean_r, miss_r), (mean_s, miss_s) = stats(*real), stats(*synthetic)
    return float((mean_r - mean_s).abs().mean()), float((miss_r - miss_s).abs().mean())


def run(setting: dict, seed: int, epochs: int) -> tuple[float, float, float, float, float]:
    L.seed_everything(seed, verbose=False)
    real = toy_records(N, seed)
    module = IGAMT(**SIZES, seed=seed, **setting)
    untrained = marginal_errors(real, module.release().sample(N, generator=torch.Generator().manual_seed(seed)))
    data = L.LightningDataModule.from_datasets(train_dataset=TensorDataset(*real), batch_size=32)
    trainer = L.Trainer(
        max_epochs=epochs, accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False,
    )  # fmt: skip
    trainer.fit(module, datamodule=data)
    trained = marginal_errors(real, module.release().sample(N, generator=torch.Generator().manual_seed(seed)))
    epsilon = module.epsilon(1e-5) if module.dp_enabled and module.nominal_reason() is None else float("inf")
    nominal = module.nominal_epsilon(1e-5) if module.dp_enabled and module.nominal_reason() else float("nan")
    return (*untrained, *trained, epsilon if module.dp_enabled else float("inf"), nominal)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--epochs", type=int, default=8)
    add_results_arguments(parser)
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    header = ["setting", "mean error untrained", "mean error trained", "missing-rate error untrained",
              "missing-rate error trained", "epsilon (pld, delta 1e-5)", "nominal epsilon"]  # fmt: skip
    print("| " + " | ".join(header) + " |")
    print("|---|---|---|---|---|---|---|")
    table, raw = [], {}
    for name, setting in SETTINGS.items():
        rows = [run(setting, seed, args.epochs) for seed in args.seeds]
        cols = list(zip(*rows, strict=True))
        raw[name] = rows
        table.append(
            [
                name,
                *(spread_cell(cols[index], digits=3) for index in (0, 2, 1, 3)),
                f"{statistics.mean(cols[4]):.3g}",
                f"{statistics.mean(cols[5]):.3g}",
            ]
        )
        print("| " + " | ".join(table[-1]) + " |", flush=True)
    write_result(
        result_name(args, "igamt_sanity"),
        title="IGAMT sanity check on toy EHR tensors: marginal errors before and after training",
        columns=header,
        rows=table,
        seeds=args.seeds,
        notes=f"error cells: mean +- sample standard deviation over the seeds; epsilons: mean over the seeds; "
        f"{args.epochs} epochs; a sanity check, not the measured acceptance",
        raw={"per_seed": raw},
        directory=args.results_dir,
    )


if __name__ == "__main__":
    main()
