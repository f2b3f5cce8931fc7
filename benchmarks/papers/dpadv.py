"""Reproduction kit: DP-Adv (Bu, Li, Wang, Zhang 2021, "Practical Adversarial Training with Differential Privacy for
Deep Learning", arXiv 2112.12497v1), Tables 2, 3 and 4.

Grid (20 cells):

* MNIST (Tables 2 and 3, sections 4.1-4.2), l_inf budget 0.2 for training and evaluation, as the paper states
  (the shipped ``configs/dpadv/mnist.yaml`` follows the authors' tutorial's 0.1; the kit overrides it to 0.2): SGD;
  adversarial training (Adv) with FGSM, PGD_inf and PGD_2; DP-SGD at epsilon 0.2, 1, 2; DP-Adv + FGSM at epsilon
  0.2, 1, 2; DP-Adv + PGD_inf and + PGD_2 at epsilon 1. Each evaluated clean and under FGSM, PGD, BIM, APGD and
  AutoAttack (l_inf 0.2). Table 2's SecureSGD and StoBatch rows quote other papers: listed, not run (StoBatch:
  ``stobatch.py``).
* CIFAR-10 with CIFAR-100 pre-training (Table 4, section 4.4): the Abadi et al. CNN pre-trained non-privately on
  CIFAR-100 for 10 epochs (``configs/papers/dpadv/cifar100_pretrain.yaml``, once per seed), its body kept and a new
  10-way head trained on CIFAR-10 (``configs/papers/dpadv/cifar10.yaml``): SGD, DP-SGD, Adv and DP-Adv with FGSM
  and PGD_inf at 4/255 and PGD_2 at 100/255, epsilon 1. Robust accuracy under each column's own training attack;
  SGD and DP-SGD under PGD_inf 4/255 (the paper does not say which attack it used for them).

Recipes: ``configs/dpadv/mnist.yaml`` (tanh CNN, SGD lr 0.25, batch 300, 15 epochs, clip 1.5, delta 1e-5) and
``configs/dpsgd/mnist.yaml`` (the same settings without the attack); ``--dp null`` for the non-private rows.

Where the paper is silent (its appendices A-B are missing), the kit chooses: epsilon 0.2 / 1 / 2 by calibrating the
noise to the target over the recipe's 15 epochs at batch 300 and clip 1.5 (the tutorial's 1.3 gives 1.04); training
PGD_inf 10 steps of 2.5 eps / 20 (the tutorial), PGD_2 training radius 1 (the l2 budget the paper evaluates at), 10
steps of 2.5 eps / 10; evaluation PGD 20 steps of 2.5 eps / 20, BIM 10 steps, APGD-CE 100 steps, AutoAttack standard;
robust accuracy on the first 1,000 test images (as the authors' tutorial), clean accuracy on all 10,000. CIFAR-10:
pre-training SGD lr 0.05 momentum 0.9 batch 256; private stage batch 512, lr 0.1 momentum 0.9, 30 epochs, clip 1.0,
delta 1e-5; the whole network fine-tuned (the paper does not say whether the body is frozen).

Smoke mode (``--smoke``): fake MNIST idx files and CIFAR-10/100 pickles, batch 16, 2 steps per cell, attacks of 2
steps (AutoAttack: APGD-CE + APGD-T of 2 steps), 8 test images; a 4-channel, 16-unit Abadi CNN on CIFAR.

Real mode's expected GPU time: see docs/reproducing.md (``--estimate`` re-derives the training part: CPU step time of
each recipe measured here, divided by an assumed GPU speed-up of 25); AutoAttack on 1,000 images per MNIST cell adds
an estimated 2-5 GPU minutes per cell.

Usage: ``python benchmarks/papers/dpadv.py [--smoke] [--seeds 0 1 2] [--cells mnist] [--estimate]``.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from paperkit import (  # noqa: E402
    PAPER_CONFIGS,
    Cell,
    Context,
    Kit,
    attack_accuracies,
    config_path,
    epsilon_of,
    fit,
    main,
    test_tensors,
)

SOURCE = "Bu et al. 2021 (arXiv 2112.12497v1), Table 2 (sec. 4.1), Table 3 (sec. 4.2), Table 4 (sec. 4.4)"
MNIST_EPS = 0.2
CIFAR_EPS, CIFAR_L2 = 4 / 255, 100 / 255
TRAIN_ATTACKS = {  # label -> (attack, eps, kwargs) for training
    "FGSM": ("FGSM", MNIST_EPS, {}),
    "PGD_inf": ("PGD", MNIST_EPS, {"steps": 10, "alpha": 2.5 * MNIST_EPS / 20}),
    "PGD_2": ("PGDL2", 1.0, {"steps": 10, "alpha": 0.25}),
}
CIFAR_ATTACKS = {
    "FGSM": ("FGSM", CIFAR_EPS, {}),
    "PGD_inf": ("PGD", CIFAR_EPS, {"steps": 10, "alpha": 1 / 255}),
    "PGD_2": ("PGDL2", CIFAR_L2, {"steps": 10, "alpha": 2.5 * CIFAR_L2 / 10}),
}
METRICS = ("clean", "FGSM", "PGD", "BIM", "APGD", "AutoAttack")
# Table 3 (sec. 4.2; MNIST, epsilon 1, l_inf 0.2): clean, FGSM, PGD, BIM, APGD, AutoAttack (%); Table 2: eps 0.2/2.
TABLE3 = {
    "SGD": ("99.1", "67.8", "33.0", "40.6", "28.9", "27.7"),
    "DP-SGD": ("97.2", "63.0", "28.0", "36.9", "20.6", "18.7"),
    "Adv+FGSM": ("99.2", "95.3", "92.4", "93.1", "92.2", "91.9"),
    "DP-Adv+FGSM": ("97.3", "86.0", "80.0", "81.5", "78.4", "78.3"),
    "Adv+PGD_inf": ("99.2", "93.8", "92.3", "92.6", "91.8", "91.7"),
    "DP-Adv+PGD_inf": ("97.4", "85.5", "81.4", "82.2", "80.6", "80.4"),
    "Adv+PGD_2": ("99.3", "92.5", "90.0", "90.6", "89.2", "89.0"),
    "DP-Adv+PGD_2": ("97.3", "83.9", "76.3", "78.1", "74.5", "74.1"),
}
TABLE2 = {  # (method, epsilon) -> (clean, FGSM) (%)
    ("DP-SGD", 0.2): ("94.5", "55.7"),
    ("DP-SGD", 2.0): ("97.6", "64.3"),
    ("DP-Adv+FGSM", 0.2): ("94.0", "74.0"),
    ("DP-Adv+FGSM", 2.0): ("97.8", "89.1"),
}
TABLE4 = {  # Table 4 (sec. 4.4; CIFAR-10, pre-trained on CIFAR-100): (clean, robust) (%)
    "SGD": ("69.0", "17.7"),
    "DP-SGD": ("64.0", "18.1"),
    "Adv+FGSM": ("64.3", "41.5"),
    "DP-Adv+FGSM": ("51.4", "32.7"),
    "Adv+PGD_inf": ("66.9", "40.0"),
    "DP-Adv+PGD_inf": ("55.7", "30.0"),
    "Adv+PGD_2": ("63.3", "44.5"),
    "DP-Adv+PGD_2": ("54.3", "37.6"),
}
SMOKE_DATA = ["--data.init_args.batch_size=16"]
SMOKE_CIFAR = [*SMOKE_DATA, '--model.init_args.model_kwargs={"channels": 4, "hidden": 16}']
MNIST_STEPS = 15 * math.ceil(54_000 / 300)  # 15 epochs of batch 300 on the 54,000 images left after validation
CIFAR_STEPS = 30 * math.ceil(45_000 / 512)
PRETRAIN_STEPS = 10 * math.ceil(45_000 / 256)


def _privacy(epsilon: float | None) -> list[str]:
    if epsilon is None:
        return ["--dp=null"]
    return ["--dp.noise_multiplier=null", f"--dp.target_epsilon={epsilon}", "--dp.delta=1e-5"]


def _train_attack(attack: tuple[str, float, dict]) -> list[str]:
    name, eps, kwargs = attack
    return [
        f"--model.init_args.attack={name}",
        f"--model.init_args.attack_eps={eps}",
        f"--model.init_args.attack_kwargs={kwargs}".replace("'", '"'),
    ]


def _mnist_suite(context: Context) -> dict[str, tuple[str, float, dict]]:
    steps = (lambda n: 2) if context.smoke else (lambda n: n)
    eps = MNIST_EPS
    autoattack = {"version": "custom", "attacks_to_run": ["apgd-ce", "apgd-t"], "steps": 2} if context.smoke else {}
    return {
        "FGSM": ("FGSM", eps, {}),
        "PGD": ("PGD", eps, {"steps": steps(20), "alpha": 2.5 * eps / 20}),
        "BIM": ("BIM", eps, {"steps": steps(10)}),
        "APGD": ("AUTOATTACK", eps, {"version": "custom", "attacks_to_run": ["apgd-ce"], "steps": steps(100)}),
        "AutoAttack": ("AUTOATTACK", eps, autoattack),
    }


def mnist_runner(method: str, epsilon: float | None, attack: str | None):
    def run(context: Context, seed: int) -> dict[str, float]:
        if attack is None:
            config, overrides = config_path("dpsgd", "mnist"), _privacy(epsilon)
        else:  # DP-Adv recipe at the paper's 0.2 (the shipped recipe's eval budget is overridden too)
            config = config_path("dpadv", "mnist")
            overrides = [
                *_privacy(epsilon),
                *_train_attack(TRAIN_ATTACKS[attack]),
                f"--model.init_args.eval_eps={MNIST_EPS}",
            ]
        fitted = fit(context, config, seed, overrides, SMOKE_DATA, "mnist", timing_key=f"mnist-{method}")
        clean = fitted.test["test/acc"]
        data = test_tensors(fitted.datamodule, context.max_eval(1000))
        accuracies = attack_accuracies(fitted.module, data, _mnist_suite(context), seed, context.device)
        return {"clean": clean, **{k: accuracies[k] for k in METRICS[1:]}, "epsilon": epsilon_of(fitted)}

    return run


def _pretrained_body(context: Context, seed: int) -> dict:
    """The CIFAR-100 pre-training stage (non-private), once per seed; its weights without the head."""
    key = ("cifar100-pretrain", seed)
    if key not in context.cache:
        fitted = fit(context, PAPER_CONFIGS / "dpadv" / "cifar100_pretrain.yaml", seed, (), SMOKE_CIFAR, "cifar100",
                     test=False, timing_key="cifar100-pretrain")  # fmt: skip
        state = fitted.module.model.state_dict()
        context.cache[key] = {name: value for name, value in state.items() if ".head." not in f".{name}"}
    return context.cache[key]


def cifar_runner(method: str, private: bool, attack: str | None):
    def run(context: Context, seed: int) -> dict[str, float]:
        body = _pretrained_body(context, seed)

        def load_body(module) -> None:
            missing, unexpected = module.model.load_state_dict(body, strict=False)
            if unexpected or any(".head." not in f".{name}" for name in missing):
                raise RuntimeError(f"pre-trained body does not fit: missing {missing}, unexpected {unexpected}")

        overrides = [*_privacy(1.0 if private else None)]
        if attack is None:  # SGD / DP-SGD: the DP-Adv recipe's model and optimizer, trained on clean examples
            overrides += ["--model.class_path=lightning_dprobust.methods.DPSGD"]
        else:
            overrides += _train_attack(CIFAR_ATTACKS[attack])
        config = PAPER_CONFIGS / "dpadv" / "cifar10.yaml"
        if attack is None:
            config = _clean_variant(config)
        fitted = fit(context, config, seed, overrides, SMOKE_CIFAR, "cifar10", timing_key=f"cifar10-{method}",
                     prepare=load_body)  # fmt: skip
        name, eps, kwargs = CIFAR_ATTACKS[attack or "PGD_inf"]
        if name == "PGD":
            kwargs = {"steps": 2 if context.smoke else 20, "alpha": 1 / 255}
        elif name == "PGDL2":
            kwargs = {"steps": 2 if context.smoke else 20, "alpha": 2.5 * eps / 20}
        data = test_tensors(fitted.datamodule, context.max_eval(None))
        accuracies = attack_accuracies(fitted.module, data, {"robust": (name, eps, kwargs)}, seed, context.device)
        return {"clean": fitted.test["test/acc"], "robust": accuracies["robust"], "epsilon": epsilon_of(fitted)}

    return run


def _clean_variant(config: Path) -> dict:
    """The CIFAR-10 stage recipe without the attack (DPSGD module, same model, optimizer, data and DP group)."""
    from paperkit import load_config

    recipe = load_config(config)
    arguments = {k: v for k, v in recipe["model"]["init_args"].items() if not k.startswith(("attack", "eval_"))}
    recipe["model"] = {"class_path": "lightning_dprobust.methods.DPSGD", "init_args": arguments}
    return recipe


def cells() -> list[Cell]:
    grid = []
    mnist_rows = [("SGD", None, None), ("Adv+FGSM", None, "FGSM"), ("Adv+PGD_inf", None, "PGD_inf"),
                  ("Adv+PGD_2", None, "PGD_2")]  # fmt: skip
    mnist_rows += [("DP-SGD", eps, None) for eps in (0.2, 1.0, 2.0)]
    mnist_rows += [("DP-Adv+FGSM", eps, "FGSM") for eps in (0.2, 1.0, 2.0)]
    mnist_rows += [("DP-Adv+PGD_inf", 1.0, "PGD_inf"), ("DP-Adv+PGD_2", 1.0, "PGD_2")]
    for method, epsilon, attack in mnist_rows:
        if epsilon in (None, 1.0):
            paper, table = (
                dict(zip(METRICS, TABLE3[method], strict=True)),
                "Tables 2-3" if attack in (None, "FGSM") else "Table 3",
            )
        else:
            paper, table = dict(zip(METRICS[:2], TABLE2[method, epsilon], strict=True)), "Table 2"
        eps_label = "inf" if epsilon is None else f"{epsilon:g}"
        grid.append(Cell(
            key=f"mnist_{method}_eps{eps_label}", labels=("MNIST", method, eps_label, table),
            run=mnist_runner(method, epsilon, attack), paper=paper, real_steps=MNIST_STEPS,
            timing_key=f"mnist-{method}",
        ))  # fmt: skip
    for method, epsilon in (("SecureSGD", 0.2), ("StoBatch", 0.2)):
        quoted = {"SecureSGD": ("38.5", "39.1"), "StoBatch": ("83.4", "82.7")}[method]
        grid.append(Cell(
            key=f"mnist_{method}_eps{epsilon:g}", labels=("MNIST", method, f"{epsilon:g}", "Table 2"), run=None,
            paper=dict(zip(METRICS[:2], quoted, strict=True)),
            skip="quoted from other work"
            + (" (see the stobatch kit)" if method == "StoBatch" else ", not in the library"),
        ))  # fmt: skip
    for method, (clean, robust) in TABLE4.items():
        attack = None if method in ("SGD", "DP-SGD") else method.split("+")[1]
        private = method.startswith("DP")
        grid.append(Cell(
            key=f"cifar10_{method}", labels=("CIFAR-10 (CIFAR-100 pre-trained)", method, "1" if private else "inf",
                                             "Table 4"),
            run=cifar_runner(method, private, attack), paper={"clean": clean, "robust": robust},
            real_steps=CIFAR_STEPS + PRETRAIN_STEPS // len(TABLE4), timing_key=f"cifar10-{method}",
            note="" if attack else "robust accuracy under PGD_inf 4/255 (the paper does not name the attack)",
        ))  # fmt: skip
    return grid


KIT = Kit(
    name="dpadv",
    title="DP-Adv: clean and robust accuracy (MNIST l_inf 0.2; CIFAR-10 l_inf 4/255 or l_2 100/255)",
    source=SOURCE,
    label_columns=("dataset", "method", "epsilon", "paper table"),
    metrics=(
        ("clean", "clean (%)", 100.0),
        *((name, f"{name} (%)", 100.0) for name in METRICS[1:]),
        ("robust", "robust, own attack (%)", 100.0),
        ("epsilon", "epsilon (measured)", 1.0),
    ),
    cells=cells(),
    datasets=("mnist", "cifar10", "cifar100"),
    notes=(
        "Epsilon: RDP accountant, delta 1e-5, per example of the private training set. MNIST attacks: l_inf 0.2 on "
        "the first 1,000 test images (real mode); clean accuracy on the whole test split. CIFAR-10 rows start from "
        "the CIFAR-100 pre-trained Abadi CNN body (one pre-training per seed, shared by the eight rows)."
    ),
)

if __name__ == "__main__":
    main(KIT, doc=__doc__)
