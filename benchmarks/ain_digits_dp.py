"""AIN vs i-FGSM adversarial training under DP-SGD on digits (Tang 2021, PhD thesis, Emory University, section 5.3;
DP-SGD: Abadi et al. 2016, https://arxiv.org/abs/1607.00133).

Why the data is cut in two. Both views of a training example (clean, adversarial) are averaged before clipping
(``AdversarialAugmentation(mode="group")``), and both attacks are example-separable (AINAttack and BIM are in
``SEPARABLE_ATTACKS``): example i's view depends on x_i, y_i, the current (already private) parameters and, for AIN,
a fixed generator with its own noise stream. A fixed generator is part of the training algorithm, so the DP-SGD
guarantee about the training set holds only if the generator, and the classifier it was trained to attack, never
saw that set. The shipped digits AIN was trained on the whole digits train split against ``mlp_tanh.erm_digits``,
itself trained on that split, so it cannot be used here. Instead, for each seed (``--seeds``, default 0 1 2):

1. the digits train split is cut into two stratified halves (fixed split, :class:`DigitsHalf`): *public* and
   *private*; the validation and test splits are those of ``DigitsDataModule``;
2. on the public half: a target classifier (``configs/erm/digits.yaml``, non-private) and an untargeted AIN against
   it (``ain_digits.train_ain``: the zoo entries' settings, ``--ain-epochs``), saved as a ``.ckpt``;
3. on the private half: ``configs/ain_advtrain_dp/digits.yaml`` (its ``ain`` replaced by the public AIN's checkpoint)
   and ``configs/ifgsm_advtrain_dp/digits.yaml``, both at epsilon 3, with the train batch halved to 128 so that the
   sample rate, the number of steps and the noise multiplier are those of the configs on the full split;
4. on the test split (seen by neither half): clean accuracy and accuracy under the public AIN, i-FGSM and PGD at
   Linf 0.2 (``ain_digits.evaluate``), and each model's epsilon (delta 1e-5, RDP accountant).

Prints a markdown table of mean +- sample std over the seeds. Usage:
``python benchmarks/ain_digits_dp.py [--seeds 0 1 2] [--ain-epochs 20] [--save-runs FILE | --from-runs FILE ...]``.
"""

from __future__ import annotations

import argparse
import logging
import tempfile
import warnings
from pathlib import Path

import numpy as np
import torch
from ain_digits import evaluate, train_ain
from seeds import Sweep, add_seed_arguments, run_or_load, seeded_config
from sklearn.model_selection import train_test_split
from torch.utils.data import TensorDataset

from lightning_dprobust.data import DigitsDataModule
from lightning_dprobust.recipes import CONFIG_DIR, build_recipe, find_dp_callback, quiet_overrides
from lightning_dprobust.robustness.reports import markdown_table
from lightning_dprobust.zoo.build import apply_override

TARGET_CONFIG = CONFIG_DIR / "erm" / "digits.yaml"
DP_CONFIGS = {
    "AIN": CONFIG_DIR / "ain_advtrain_dp" / "digits.yaml",
    "i-FGSM": CONFIG_DIR / "ifgsm_advtrain_dp" / "digits.yaml",
}
AIN_OVERRIDE = "trainer.callbacks.AdversarialAugmentation.init_args.attack.init_args.ain"
COLUMNS = ("clean", "AIN", "i-FGSM", "PGD")


class DigitsHalf(DigitsDataModule):
    """``DigitsDataModule`` whose train split is one of two fixed stratified halves (``"public"`` or ``"private"``,
    disjoint, split with ``random_state=0``); validation and test splits unchanged."""

    def __init__(self, half: str, **kwargs) -> None:
        super().__init__(**kwargs)
        if half not in ("public", "private"):
            raise ValueError(f"half must be 'public' or 'private', got {half!r}")
        self.half = half

    def setup(self, stage: str | None = None) -> None:
        if self.train_set is not None:
            return
        super().setup(stage)
        x, y = self.train_set.tensors
        public, private = train_test_split(np.arange(len(y)), test_size=0.5, stratify=y.numpy(), random_state=0)
        keep = torch.from_numpy(np.sort(public if self.half == "public" else private))
        self.train_set = TensorDataset(x[keep], y[keep])


def fit_config(config: Path, seed: int, data: DigitsHalf, workdir: str, overrides: dict | None = None):
    """Fit a ``dprobust fit`` config (seeded, quiet, ``overrides`` applied, files in a new folder under ``workdir``) on
    ``data``; return the CLI."""
    config = seeded_config(config, seed)
    for dotted, value in (overrides or {}).items():
        apply_override(config, dotted, value)
    cli = build_recipe(config, quiet_overrides(tempfile.mkdtemp(dir=workdir), device="cpu"))
    cli.trainer.fit(cli.model, data)
    return cli


def run(seed: int, args: argparse.Namespace) -> dict[str, float]:
    workdir = tempfile.mkdtemp(prefix="ain-digits-dp-")
    target = fit_config(TARGET_CONFIG, seed, DigitsHalf("public", batch_size=128), workdir).model.model.eval()
    ckpt = f"{workdir}/public_ain.ckpt"
    ain = train_ain(seed, None, args.ain_epochs, target=target, data=DigitsHalf("public", batch_size=32), ckpt=ckpt)
    test = DigitsDataModule()
    test.setup("test")
    x, y = test.test_set.tensors
    metrics = {"public_ain_bound": ain.bound}
    for source, config in DP_CONFIGS.items():
        overrides = {AIN_OVERRIDE: ckpt} if source == "AIN" else {}
        cli = fit_config(config, seed, DigitsHalf("private", batch_size=128), workdir, overrides)
        metrics[f"dp/{source}/epsilon"] = find_dp_callback(cli.trainer).epsilon()
        for name, value in evaluate(cli.model.model, ain.generator, x, y, seed).items():
            metrics[f"dp/{source}/{name}"] = value
    return metrics


def report(result: Sweep) -> str:
    rows = [
        [
            source,
            result.cell(f"dp/{source}/epsilon", digits=3),
            *(result.cell(f"dp/{source}/{n}", 100) for n in COLUMNS),
        ]
        for source in DP_CONFIGS
    ]
    header = ["trained on", "epsilon", "clean", "AIN 0.2", "i-FGSM 0.2", "PGD 0.2"]
    return f"DP adversarial training, accuracy (%), {result.note()}\n\n" + markdown_table(header, rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_seed_arguments(parser)
    parser.add_argument("--ain-epochs", type=int, default=20, help="public AIN training epochs (default 20)")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    torch.set_num_threads(1)
    print(report(run_or_load(lambda seed: run(seed, args), args, "AIN vs i-FGSM under DP-SGD on digits")))


if __name__ == "__main__":
    main()
