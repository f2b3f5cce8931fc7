"""AIN vs i-FGSM adversarial training under DP-SGD on digits (Tang 2021, PhD thesis, Emory University, section 5.3;
DP-SGD: Abadi et al. 2016, https://arxiv.org/abs/1607.00133).

Why the data is cut in two. Both views of a training example (clean, adversarial) are averaged before clipping
(``AdversarialAugmentation(mode="group")``), and both attacks are example-separable (AINAttack and BIM are in
``SEPARABLE_ATTACKS``): example i's view depends on x_i, y_i, the current (already private) parameters and, for AIN,
a fixed generator with its own noise stream. A fixed generator is part of the training algorithm, so the DP-SGD
guarantee about the training set holds only if the generator, and the classifier it was trained to attack, never
saw that set. The digits AIN ``ain_generator.ain_digits_untargeted`` was trained on the whole train split against
``mlp_tanh.erm_digits``, itself trained on that split, so it cannot be used here. For each seed (``--seeds``, default
0 1 2):

1. the digits train split is cut into two stratified halves, ``DigitsDataModule(train_part="public")`` and
   ``train_part="private"`` (disjoint; the validation and test splits are those of the whole module);
2. on the public half: a target classifier (``configs/erm/digits.yaml``, non-private, batch 128, as the zoo entry
   ``mlp_tanh.erm_digits_public``) and an untargeted AIN against it trained down to Linf 0.2, the bound it attacks
   at (``ain_digits.train_ain``: the zoo entries' settings, ``--ain-epochs``; the thesis trains one AIN per final
   bound), saved as a ``.ckpt``: each seed gets its own, so the spread includes the AIN's;
3. on the private half: ``configs/ain_advtrain_dp/digits.yaml`` (its ``ain`` replaced by this public AIN's checkpoint)
   and ``configs/ifgsm_advtrain_dp/digits.yaml`` as shipped, both at epsilon 3 (batch 128 on the half: the sample
   rate, steps and noise multiplier of batch 256 on the whole split), and, without adversarial training (row
   ``none``), ``configs/dpsgd/digits.yaml`` with the same data;
4. on the test split (seen by neither half): clean accuracy and accuracy under the public AIN (conditioned on the
   model's prediction), i-FGSM and PGD at Linf 0.2 (``ain_digits.evaluate``), and each model's epsilon (delta 1e-5,
   RDP accountant).

Prints a markdown table of mean +- sample std over the seeds. Usage:
``python benchmarks/ain_digits_dp.py [--seeds 0 1 2] [--ain-epochs 20] [--save-runs FILE | --from-runs FILE ...]``.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import torch
from ain_digits import TRAIN_EPS, evaluate, train_ain
from seeds import Sweep, add_seed_arguments, quiet_training, run_or_load, seeded_config

from lightning_dprobust.data import DigitsDataModule
from lightning_dprobust.recipes import CONFIG_DIR, build_recipe, find_dp_callback, quiet_overrides
from lightning_dprobust.robustness.reports import markdown_table
from lightning_dprobust.zoo.build import apply_override
from results import add_results_arguments, result_name, write_result

TARGET_CONFIG = CONFIG_DIR / "erm" / "digits.yaml"
PUBLIC_TARGET = {"data.init_args.train_part": "public", "data.init_args.batch_size": 128}
PRIVATE = {"data.init_args.train_part": "private", "data.init_args.batch_size": 128}
DP_CONFIGS = {
    "AIN": (CONFIG_DIR / "ain_advtrain_dp" / "digits.yaml", {}),
    "i-FGSM": (CONFIG_DIR / "ifgsm_advtrain_dp" / "digits.yaml", {}),
    "none": (CONFIG_DIR / "dpsgd" / "digits.yaml", PRIVATE),
}
"""Per row: the config fitted on the private half and its overrides (the AIN row's ``ain`` is set per seed)."""
AIN_OVERRIDE = "trainer.callbacks.AdversarialAugmentation.init_args.attack.init_args.ain"
COLUMNS = ("clean", "AIN", "i-FGSM", "PGD")


def fit_config(config: Path, seed: int, workdir: str, overrides: dict | None = None):
    """Fit a ``dprobust fit`` config (seeded, quiet, ``overrides`` applied, files in a new folder under ``workdir``);
    return the CLI."""
    config = seeded_config(config, seed)
    for dotted, value in (overrides or {}).items():
        apply_override(config, dotted, value)
    cli = build_recipe(config, quiet_overrides(tempfile.mkdtemp(dir=workdir), device="cpu"))
    cli.trainer.fit(cli.model, cli.datamodule)
    return cli


def run(seed: int, args: argparse.Namespace) -> dict[str, float]:
    workdir = tempfile.mkdtemp(prefix="ain-digits-dp-")
    target = fit_config(TARGET_CONFIG, seed, workdir, PUBLIC_TARGET).model.model.eval()
    ckpt = f"{workdir}/public_ain.ckpt"
    public = DigitsDataModule(train_part="public", batch_size=32)
    ain = train_ain(seed, None, args.ain_epochs, TRAIN_EPS, target=target, data=public, ckpt=ckpt)
    test = DigitsDataModule()
    test.setup("test")
    x, y = test.test_set.tensors
    metrics = {"public_ain_bound": ain.bound}
    for source, (config, overrides) in DP_CONFIGS.items():
        cli = fit_config(config, seed, workdir, {**overrides, AIN_OVERRIDE: ckpt} if source == "AIN" else overrides)
        if cli.datamodule.train_part != "private":
            raise ValueError(f"{config} must train on the private half (data.init_args.train_part: private)")
        metrics[f"dp/{source}/epsilon"] = find_dp_callback(cli.trainer).epsilon()
        for name, value in evaluate(cli.model.model, ain.generator, x, y, seed).items():
            metrics[f"dp/{source}/{name}"] = value
    return metrics


HEADER = ["trained on", "epsilon", "clean", "AIN 0.2", "i-FGSM 0.2", "PGD 0.2"]


def rows_of(result: Sweep) -> list[list[str]]:
    return [
        [
            source,
            result.cell(f"dp/{source}/epsilon", digits=3),
            *(result.cell(f"dp/{source}/{n}", 100) for n in COLUMNS),
        ]
        for source in DP_CONFIGS
    ]


def report(result: Sweep) -> str:
    return f"DP adversarial training, accuracy (%), {result.note()}\n\n" + markdown_table(HEADER, rows_of(result))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_seed_arguments(parser)
    parser.add_argument("--ain-epochs", type=int, default=20, help="public AIN training epochs (default 20)")
    add_results_arguments(parser)
    args = parser.parse_args()
    quiet_training()
    torch.set_num_threads(1)
    result = run_or_load(lambda seed: run(seed, args), args, "AIN vs i-FGSM under DP-SGD on digits")
    print(report(result))
    write_result(
        result_name(args, "ain_digits_dp"),
        title="AIN vs i-FGSM adversarial training under DP-SGD on digits (epsilon 3): accuracy (%)",
        columns=HEADER,
        rows=rows_of(result),
        seeds=result.seeds,
        notes=f"{result.note()}; public half: target classifier and AIN ({args.ain_epochs} epochs); private half: "
        "DP training; test split: evaluation at Linf 0.2",
        raw={"runs": result.runs},
        directory=args.results_dir,
    )


if __name__ == "__main__":
    main()
