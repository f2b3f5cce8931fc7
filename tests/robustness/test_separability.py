"""Separability: every attack accepted on training data makes example i's view a function of example i alone."""

from __future__ import annotations

import pytest
import torch
import torchattacks
from torchattacks.attack import Attack

from lightning_dprobust.models import AINGenerator
from lightning_dprobust.robustness.ain_attack import AINAttack
from lightning_dprobust.robustness.attacks import SmoothAdv
from lightning_dprobust.robustness.multilabel import MultilabelFGSM
from lightning_dprobust.robustness.separability import (
    COUPLED_ATTACKS,
    PER_EXAMPLE_ATTACKS,
    SEPARABLE_ATTACKS,
    PerExampleAttack,
    check_separability,
    register_separable_attack,
    training_attack,
)

EPS = 0.1
BATCH = 8
INDICES = (0, 3, BATCH - 1)


def _ain(model, random):
    """An (untrained) AIN generator at bound EPS; ``random=False`` turns its noise injection off."""
    generator = AINGenerator(10, (1, 8, 8), channels=(8, 8, 8, 8), noise_std=0.5 if random else 0.0)
    generator.bound.fill_(EPS)
    return AINAttack(model, generator, eps=EPS)


def _cheap_autoattack(model):
    """AutoAttack with its four parts cut to a few steps and queries, so a per-example run takes a second."""
    attack = torchattacks.AutoAttack(model, eps=EPS, n_classes=10)
    parts = attack._autoattack.attacks
    for part in parts:
        part.steps = 3
    parts[-1].n_queries = 100
    return attack


# Each accepted class with a builder `(model, random) -> Attack`; `random=False` turns its random draws off.
ACCEPTED = {
    torchattacks.FGSM: lambda m, random: torchattacks.FGSM(m, eps=EPS),
    torchattacks.PGD: lambda m, random: torchattacks.PGD(m, eps=EPS, alpha=0.03, steps=5, random_start=random),
    torchattacks.PGDL2: lambda m, random: torchattacks.PGDL2(m, eps=1.0, alpha=0.3, steps=5, random_start=random),
    torchattacks.BIM: lambda m, random: torchattacks.BIM(m, eps=EPS, alpha=0.03, steps=5),
    torchattacks.MIFGSM: lambda m, random: torchattacks.MIFGSM(m, eps=EPS, alpha=0.03, steps=5),
    torchattacks.DeepFool: lambda m, random: torchattacks.DeepFool(m, steps=3),
    SmoothAdv: lambda m, random: SmoothAdv(m, eps=0.5, sigma=0.25 if random else 0.0, steps=3, num_noise=2),
    MultilabelFGSM: lambda m, random: MultilabelFGSM(m, eps=EPS),
    torchattacks.CW: lambda m, random: torchattacks.CW(m, c=1, steps=5, lr=0.5),
    AINAttack: _ain,
}
PER_EXAMPLE = {
    torchattacks.APGD: lambda m, random: torchattacks.APGD(m, eps=EPS, steps=3),
    torchattacks.APGDT: lambda m, random: torchattacks.APGDT(m, eps=EPS, steps=3, n_classes=10),
    torchattacks.FAB: lambda m, random: torchattacks.FAB(m, eps=3 * EPS, steps=10, n_classes=10),
    torchattacks.Square: lambda m, random: torchattacks.Square(m, eps=2 * EPS, n_queries=100),
    torchattacks.AutoAttack: lambda m, random: _cheap_autoattack(m),
    torchattacks.MultiAttack: lambda m, random: torchattacks.MultiAttack(
        [torchattacks.APGD(m, eps=EPS, steps=3), torchattacks.Square(m, eps=2 * EPS, n_queries=100)]
    ),
}


@pytest.fixture(scope="module")
def trained(digits_classifier):
    model, x, y = digits_classifier
    return model, x[:BATCH], y[:BATCH]


def _labels_for(cls, y):
    return torch.nn.functional.one_hot(y, 10).float() if cls is MultilabelFGSM else y


def test_every_registered_attack_is_covered_by_the_generic_test():
    assert set(ACCEPTED) == set(SEPARABLE_ATTACKS) | set(PER_EXAMPLE_ATTACKS)
    assert set(PER_EXAMPLE) == set(COUPLED_ATTACKS)


@pytest.mark.parametrize("cls", list(ACCEPTED) + [PerExampleAttack, *PER_EXAMPLE], ids=lambda c: c.__name__)
def test_changing_or_removing_one_example_leaves_every_other_view_unchanged(trained, cls):
    model, x, y = trained
    if cls in PER_EXAMPLE:  # a coupled attack is accepted only wrapped to run one example at a time
        build = lambda m, random: PerExampleAttack(PER_EXAMPLE[cls](m, random))  # noqa: E731
    elif cls is PerExampleAttack:
        build = lambda m, random: PerExampleAttack(torchattacks.PGD(m, eps=EPS, random_start=random))  # noqa: E731
    else:
        build = ACCEPTED[cls]
    if cls in PER_EXAMPLE:  # separable by construction, and slow: a smaller batch
        x, y = x[:3], y[:3]
    labels = _labels_for(cls, y)
    attack, deterministic = training_attack(build(model, True)), training_attack(build(model, False))
    with torch.enable_grad():
        moved = (attack(x, labels) != x).flatten(1).any(1)
    assert moved.any(), "the attack must move some examples, or the comparison below proves nothing"
    for index in INDICES if cls not in PER_EXAMPLE else (1,):
        changed = check_separability(attack, x, labels, index=index).changed
        removed = check_separability(deterministic, x, labels, index=index).removed
        assert changed <= 1e-6 and removed <= 1e-5, (index, changed, removed)


@pytest.mark.parametrize(
    "build",
    [
        lambda m: torchattacks.APGD(m, eps=EPS, steps=3),
        lambda m: torchattacks.Square(m, eps=2 * EPS, n_queries=100),
        lambda m: torchattacks.CW(m, c=1, steps=30, lr=2.0),  # stops early on the batch-summed cost
    ],
    ids=["APGD", "Square", "CW"],
)
def test_the_check_detects_attacks_that_couple_a_batch(trained, build):
    model, x, y = trained
    reports = [check_separability(build(model), x, y, index=index) for index in INDICES]
    assert max(report.changed for report in reports) > 0.05


@pytest.mark.parametrize("cls", list(COUPLED_ATTACKS), ids=lambda c: c.__name__)
def test_coupled_attacks_are_refused_naming_the_fix(trained, cls):
    with pytest.raises(ValueError, match=r"cannot run on private training data: .*PGD.*PerExampleAttack"):
        training_attack(PER_EXAMPLE[cls](trained[0], True))


def test_cw_runs_one_example_at_a_time_and_separable_attacks_run_as_they_are(trained):
    model = trained[0]
    cw = torchattacks.CW(model, steps=3)
    wrapped = training_attack(cw)
    assert isinstance(wrapped, PerExampleAttack) and wrapped.inner is cw
    pgd = torchattacks.PGD(model, eps=EPS)
    assert training_attack(pgd) is pgd


def test_unknown_classes_and_custom_targets_are_refused_until_declared(trained):
    model = trained[0]

    class TweakedPGD(torchattacks.PGD):
        pass

    class Opaque(Attack):
        def forward(self, images, labels):
            return images

    with pytest.raises(ValueError, match="TweakedPGD is not known to be example-separable.*register_separable_attack"):
        training_attack(TweakedPGD(model, eps=EPS))
    with pytest.raises(ValueError, match="PerExampleAttack\\(Opaque\\) wraps an attack class it does not know"):
        training_attack(PerExampleAttack(Opaque("Opaque", model)))
    targeted = torchattacks.PGD(model, eps=EPS)
    targeted.set_mode_targeted_by_function(lambda images, labels: labels.roll(1), quiet=True)
    with pytest.raises(ValueError, match="custom target function"):
        training_attack(targeted)
    register_separable_attack(TweakedPGD, "PGD unchanged")
    declared = TweakedPGD(model, eps=EPS)
    assert training_attack(declared) is declared
    with pytest.raises(ValueError, match="needs a reason"):
        register_separable_attack(TweakedPGD, " ")
    with pytest.raises(TypeError, match="Attack class"):
        register_separable_attack(torch.nn.Linear, "not an attack")


def test_the_check_needs_two_examples(trained):
    model, x, y = trained
    with pytest.raises(ValueError, match=">= 2 examples"):
        check_separability(torchattacks.FGSM(model), x[:1], y[:1])
    with pytest.raises(ValueError, match="index"):
        check_separability(torchattacks.FGSM(model), x, y, index=BATCH)


def test_per_example_attack_passes_an_empty_batch_through(trained):
    model = trained[0]
    empty = torch.zeros(0, 1, 8, 8)
    assert PerExampleAttack(torchattacks.CW(model))(empty, torch.zeros(0, dtype=torch.long)).shape == empty.shape
