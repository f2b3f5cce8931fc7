"""AIN (Tang 2021, PhD thesis, chapter 5) on digits against the shipped non-private classifier mlp_tanh.erm_digits.

For each seed (``--seeds``, default 0 1 2: AIN's and the classifiers' initialization, the attacks' random streams):

1. for each Linf bound 0.1, 0.2, 0.3 and each mode, trains one AIN down to that bound, as the thesis trains one AIN
   per final bound (section 5.2.3): the settings of ``configs/ain/digits.yaml`` except, as for the shipped zoo
   entries, plain exponential decay from 0.8 down to the bound (its rate set so that the bound is reached after 70%
   of ``--ain-epochs``), batch 32 and lr 2e-3; targeted (class 8) and untargeted: six AINs per seed;
2. measures on the test split the attack success rate at each bound of that bound's AIN, conditioned on the
   classifier's prediction (``AIN``: what an attacker without labels has) and on the true label (``AIN (true
   label)``), i-FGSM (BIM, 10 steps of eps/10), PGD (10 steps, random start) and CW (torchattacks' L2 CW, 50 steps,
   its perturbation then clipped to the Linf ball: CW has no Linf budget of its own). Targeted success: classified
   as 8 (examples of class 8 left out); untargeted: misclassified;
3. times every attack per example on the whole test split in one run (seed 0, eps 0.2), as a ratio to FGSM;
4. adversarially trains mlp_tanh (the zoo classifier's architecture) on [clean ; adversarial] views
   (``AdversarialAugmentation(mode="group")``) with the seed's untargeted AIN trained to 0.2 or with i-FGSM at eps
   0.2, and reports clean accuracy and accuracy under that AIN, i-FGSM and PGD at eps 0.2 (skipped with
   ``--skip-adversarial-training``).

The decay is not adaptive (no Algorithm 2 rollbacks), as for the shipped zoo entries.

Prints markdown tables of mean +- sample std over the seeds. Usage:
``python benchmarks/ain_digits.py [--seeds 0 1 2] [--ain-epochs 20] [--skip-adversarial-training]
[--save-runs FILE | --from-runs FILE ...]``.
"""

from __future__ import annotations

import argparse
import math
import tempfile
import time

import lightning as L
import torch
import torchattacks
from seeds import Sweep, add_seed_arguments, quiet_training, run_or_load

from lightning_dprobust import zoo
from lightning_dprobust.callbacks import AdversarialAugmentation
from lightning_dprobust.data import DigitsDataModule
from lightning_dprobust.methods import AIN, ClassifierModule
from lightning_dprobust.robustness.ain_attack import AINAttack, success_rate
from lightning_dprobust.robustness.attacks import build_attack, robust_accuracy
from lightning_dprobust.robustness.reports import markdown_table
from results import add_results_arguments, result_name, write_result

TARGET, TARGET_CLASS, BOUNDS, TRAIN_EPS = "mlp_tanh.erm_digits", 8, (0.1, 0.2, 0.3), 0.2
ATTACKS = ("AIN", "AIN (true label)", "i-FGSM", "PGD", "CW")
MODES = {"targeted": TARGET_CLASS, "untargeted": None}


def _trainer(epochs: int, **kwargs) -> L.Trainer:
    """A quiet CPU trainer writing into a scratch folder (AIN's example images included)."""
    return L.Trainer(
        default_root_dir=tempfile.mkdtemp(prefix="ain-digits-"),
        max_epochs=epochs,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        **kwargs,
    )


def train_ain(
    seed: int,
    target_class: int | None,
    epochs: int,
    bound: float,
    target: str | torch.nn.Module = TARGET,
    data=None,
    ckpt=None,
) -> AIN:
    """configs/ain/digits.yaml with plain exponential decay from 0.8 to ``bound``, reached after 70% of the epochs
    and kept after, against ``target`` on ``data`` (default: the digits data module, batch 32); with ``ckpt``, the
    fitted AIN is saved there. The thesis trains one AIN per final bound (section 5.2.3)."""
    L.seed_everything(seed, verbose=False)
    rate = math.log(bound / 0.8) / (0.7 * epochs)
    module = AIN(
        target=target,
        target_class=target_class,
        num_classes=10,
        input_shape=(1, 8, 8),
        noise_seed=seed,
        generator_kwargs={"channels": [8, 16, 16, 32]},
        adaptive=False,
        decay_rate=rate,
        min_bound=bound,
        lr=2e-3,
    )
    trainer = _trainer(epochs)
    trainer.fit(module, data or DigitsDataModule(batch_size=32))
    if ckpt is not None:
        trainer.save_checkpoint(ckpt)
    return module


def _attack(name: str, model, eps: float, target_class: int | None, ain=None, seed: int = 0):
    if name.startswith("AIN"):
        return AINAttack(model, ain, eps, seed=seed, condition="true_label" if "true label" in name else "prediction")
    if name == "CW":
        attack = _LinfCW(torchattacks.CW(model, c=1.0, steps=50, lr=0.01), eps)
    elif name == "FGSM":
        attack = torchattacks.FGSM(model, eps=eps)
    else:
        attack = build_attack("BIM" if name == "i-FGSM" else "PGD", model, eps, steps=10)
    target = attack.inner if isinstance(attack, _LinfCW) else attack
    if target_class is not None:
        target.set_mode_targeted_by_function(lambda x, y: torch.full_like(y, target_class), quiet=True)
    return attack


class _LinfCW(torchattacks.attack.Attack):
    """CW-L2's examples with their perturbation clipped to the Linf ball of radius eps."""

    def __init__(self, inner, eps: float) -> None:
        super().__init__("LinfCW", inner.model)
        self.inner, self.eps = inner, eps

    def forward(self, images, labels):
        adversarial = self.inner(images, labels)
        return (images + (adversarial - images).clamp(-self.eps, self.eps)).clamp(0, 1)


def attack_success(seed: int, epochs: int, target, x, y) -> tuple[dict[str, float], dict[str, dict[float, AIN]]]:
    """Success rates at each bound of that bound's own AIN (one trained per bound and mode) and of the other attacks;
    returns the metrics and the AINs by mode and bound."""
    metrics, ains = {}, {mode: {} for mode in MODES}
    for mode, target_class in MODES.items():
        for eps in BOUNDS:
            ain = ains[mode][eps] = train_ain(seed, target_class, epochs, eps)
            metrics[f"{mode}/ain_bound/{eps}"] = ain.bound
            for name in ATTACKS:
                torch.manual_seed(seed)
                attack = _attack(name, target, eps, target_class, ain.generator, seed)
                metrics[f"{mode}/{name}/{eps}"] = success_rate(target, attack(x, y), y, target_class)
    return metrics, ains


def timing(target, x, y, ain) -> dict[str, float]:
    """Seconds per example of each attack on the whole test split, one run each (untargeted, eps 0.2)."""
    seconds = {}
    for name in ("FGSM", *ATTACKS):
        attack = _attack(name, target, TRAIN_EPS, None, ain)
        start = time.perf_counter()
        attack(x, y)
        seconds[name] = (time.perf_counter() - start) / len(x)
    return seconds


def adversarial_training(seed: int, ain, x, y, epochs: int) -> dict[str, float]:
    metrics = {}
    for source in ("AIN", "i-FGSM"):
        L.seed_everything(seed, verbose=False)
        data = DigitsDataModule(batch_size=64)
        module = ClassifierModule(
            "mlp_tanh", model_kwargs={"hidden": 64}, mean=data.mean, std=data.std, optimizer="adam", lr=0.01
        )
        factory = (
            (lambda m: AINAttack(m, ain, TRAIN_EPS, seed=seed))
            if source == "AIN"
            else (lambda m: build_attack("BIM", m, TRAIN_EPS, steps=10))
        )
        _trainer(epochs, callbacks=[AdversarialAugmentation(factory, mode="group", seed=seed)]).fit(module, data)
        metrics |= {f"at/{source}/{name}": value for name, value in evaluate(module.model, ain, x, y, seed).items()}
    return metrics


def evaluate(model, ain, x, y, seed: int) -> dict[str, float]:
    """Clean accuracy and accuracy under the untargeted ``ain``, i-FGSM and PGD at Linf ``TRAIN_EPS`` on ``(x, y)``."""
    model = model.eval()
    suite = {name: _attack(name, model, TRAIN_EPS, None, ain, seed) for name in ("AIN", "i-FGSM", "PGD")}
    return robust_accuracy(model, (x, y), suite, seed=seed)


def run(seed: int, args: argparse.Namespace) -> dict[str, float]:
    target = zoo.load(TARGET).requires_grad_(False)
    data = DigitsDataModule()
    data.setup("test")
    x, y = data.test_set.tensors
    metrics, ains = attack_success(seed, args.ain_epochs, target, x, y)
    ain = ains["untargeted"][TRAIN_EPS].generator
    if seed == args.seeds[0]:
        metrics |= {f"time/{name}": value for name, value in timing(target, x, y, ain).items()}
    if args.skip_adversarial_training:
        return metrics
    return metrics | adversarial_training(seed, ain, x, y, args.classifier_epochs)


def tables(result: Sweep) -> list[tuple[str, str, list[str], list[list[str]], bool]]:
    """``(stem suffix, title, header, rows, seeded)`` of each table the sweep holds: success rates per mode, the
    attacks' times (one run) and, if measured, adversarial training."""
    found = []
    for mode in MODES:
        rows = [[name, *(result.cell(f"{mode}/{name}/{eps}", 100) for eps in BOUNDS)] for name in ATTACKS]
        header = ["attack", *(f"Linf {eps}" for eps in BOUNDS)]
        found.append((f"success_{mode}", f"{mode} success rate (%), each bound's own AIN", header, rows, True))
    if "time/FGSM" in result.runs[0]:
        fgsm = result.runs[0]["time/FGSM"]
        rows = [
            [name, f"{1e3 * result.runs[0][f'time/{name}']:.3f}", f"{result.runs[0][f'time/{name}'] / fgsm:.1f}"]
            for name in ("FGSM", *ATTACKS)
        ]
        found.append(("timing", "time per example (one run)", ["attack", "ms", "x FGSM"], rows, False))
    if "at/AIN/clean" in result.runs[0]:
        rows = [
            [source, *(result.cell(f"at/{source}/{name}", 100) for name in ("clean", "AIN", "i-FGSM", "PGD"))]
            for source in ("AIN", "i-FGSM")
        ]
        header = ["trained on", "clean", "AIN 0.2", "i-FGSM 0.2", "PGD 0.2"]
        found.append(("adversarial_training", "adversarial training, accuracy (%)", header, rows, True))
    return found


def report(result: Sweep) -> str:
    return "\n\n".join(
        f"{title}{f', {result.note()}' if seeded else ''}\n\n" + markdown_table(header, rows)
        for _, title, header, rows, seeded in tables(result)
    )


def write_results(result: Sweep, args: argparse.Namespace) -> None:
    """One result file per table: ``ain_digits_success_targeted``, ``..._untargeted``, ``..._timing`` and
    ``..._adversarial_training`` (without ``--skip-adversarial-training``)."""
    for suffix, title, header, rows, seeded in tables(result):
        write_result(
            f"{result_name(args, 'ain_digits')}_{suffix}",
            title=f"AIN on digits against {TARGET}: {title}",
            columns=header,
            rows=rows,
            seeds=result.seeds if seeded else result.seeds[:1],
            notes=(result.note() if seeded else f"one run, seed {result.seeds[0]}, eps {TRAIN_EPS}, whole test split")
            + f"; AIN epochs {args.ain_epochs}",
            raw={"runs": result.runs} if seeded else {},
            directory=args.results_dir,
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_seed_arguments(parser)
    parser.add_argument("--ain-epochs", type=int, default=20, help="AIN training epochs (default 20)")
    parser.add_argument("--classifier-epochs", type=int, default=15, help="adversarial training epochs (default 15)")
    parser.add_argument("--skip-adversarial-training", action="store_true", help="measure the attacks only (parts 1-3)")
    add_results_arguments(parser)
    args = parser.parse_args()
    quiet_training()
    torch.set_num_threads(1)
    result = run_or_load(lambda seed: run(seed, args), args, "AIN on digits")
    print(report(result))
    write_results(result, args)


if __name__ == "__main__":
    main()
