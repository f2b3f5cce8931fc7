"""Example-separable attacks: on private training data, example ``i``'s adversarial view depends on example ``i`` alone.

DP-SGD's guarantee (Abadi et al. 2016, https://arxiv.org/abs/1607.00133) rests on one sensitivity bound: adding or
removing one example changes the sum of clipped per-example gradients by at most the clipping norm ``C``. Adversarial
training keeps that bound (Bu et al. 2021, https://arxiv.org/abs/2112.12497, Section 3.3) only when example ``i``'s
adversarial view is a function of example ``i``, its label, the current parameters and randomness drawn independently
of the data. An attack that couples the examples of a batch breaks it: APGD restarts on the examples that are still
classified correctly and CW stops early on the batch-summed cost, so removing one example moves the others' views and
the clipped sum by more than ``C``.

:func:`training_attack` is the one entry point every attack on training data goes through. It accepts the attacks
whose source was checked to be separable (:data:`SEPARABLE_ATTACKS`), runs CW one example at a time
(:class:`PerExampleAttack`: exact, and cheap at CW's step counts on small models), and refuses the attacks that couple
a batch (:data:`COUPLED_ATTACKS`) and every class it does not know, naming the fix. Classes are matched exactly: a
subclass of an accepted attack may change ``forward`` and must be declared with :func:`register_separable_attack`
(after :func:`check_separability`). What "separable" means for randomness: an attack may draw one random tensor for
the whole batch, as PGD's random start does, provided example ``i``'s slice is drawn independently of the data.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import NamedTuple

import torch
import torchattacks
from torch import Tensor
from torchattacks.attack import Attack

from lightning_dprobust.robustness.ain_attack import AINAttack
from lightning_dprobust.robustness.attacks import SmoothAdv
from lightning_dprobust.robustness.multilabel import MultilabelFGSM
from lightning_dprobust.robustness.randomness import isolated_rng, seed_everything_quietly

SEPARABLE_ATTACKS: dict[type[Attack], str] = {
    torchattacks.FGSM: "one signed gradient step of the batch-mean loss: sign(g_i / B) = sign(g_i)",
    torchattacks.PGD: "signed steps and a per-example projection; the random start is drawn elementwise",
    torchattacks.PGDL2: "steps normalized by each example's own gradient norm (the 1e-10 stabilizer acts on g_i / B)",
    torchattacks.BIM: "signed steps of the batch-mean loss and a per-example projection",
    torchattacks.MIFGSM: "each example's gradient is scaled by its own mean |g|; momentum is kept per example",
    torchattacks.DeepFool: "runs one example at a time; each example stops on its own",
    SmoothAdv: "per-example normalized steps on each example's own noise draws",
    MultilabelFGSM: "one signed gradient step of the summed BCE loss",
    AINAttack: "one generator pass per example (per-example layer norms), noise drawn elementwise from its generator",
}
"""Attacks whose batched run is separable (torchattacks 3.5.1 sources checked), with the reason."""

PER_EXAMPLE_ATTACKS: dict[type[Attack], str] = {
    torchattacks.CW: "CW stops early when the cost summed over the batch rises, so it is run one example at a time",
}
"""Attacks that couple a batch but are cheap enough to run one example at a time automatically."""

COUPLED_ATTACKS: dict[type[Attack], str] = {
    torchattacks.APGD: "APGD restarts on the examples still classified correctly and reseeds the global RNG",
    torchattacks.APGDT: "APGD-T restarts on the examples still classified correctly and reseeds the global RNG",
    torchattacks.FAB: "FAB restarts on the examples still classified correctly and reseeds the global RNG",
    torchattacks.Square: "Square searches on the examples not yet fooled, with draws shared by the whole batch",
    torchattacks.AutoAttack: "AutoAttack runs APGD, APGD-T, FAB and Square on the examples still robust",
    torchattacks.MultiAttack: "MultiAttack runs each later attack on the examples the earlier ones did not fool",
}
"""Attacks refused on training data: their batched run couples examples and they are too slow to run one by one
silently; wrap them in :class:`PerExampleAttack` to run them one example at a time."""

_DECLARED: dict[type[Attack], str] = {}
_PER_EXAMPLE_MODES = ("default", "targeted(random)", "targeted(least-likely)", "targeted(label)")


def register_separable_attack(cls: type[Attack], reason: str) -> type[Attack]:
    """Declare ``cls`` separable, so :func:`training_attack` accepts it; ``reason`` says why (shown in errors).

    Check the claim first with :func:`check_separability` on a batch of your data. Returns ``cls`` (usable as a
    decorator through ``functools.partial``).
    """
    if not (isinstance(cls, type) and issubclass(cls, Attack)):
        raise TypeError(f"register_separable_attack needs a torchattacks Attack class, got {cls!r}")
    if not reason.strip():
        raise ValueError("register_separable_attack needs a reason: why is example i's view a function of i alone?")
    _DECLARED[cls] = reason
    return cls


class PerExampleAttack(Attack):
    """Runs ``attack`` on one example at a time: example ``i``'s view is ``attack(x[i:i+1], y[i:i+1])``.

    Exact separability for any attack that keeps no data-dependent state between calls (every class in
    :data:`SEPARABLE_ATTACKS`, :data:`PER_EXAMPLE_ATTACKS` and :data:`COUPLED_ATTACKS` qualifies), at the cost of
    ``B`` forward/backward passes of one example instead of one pass of ``B``. Device and model-mode settings reach the
    wrapped attack (torchattacks propagates them to attacks held as attributes).

    Args:
        attack: the attack to run example by example.
    """

    def __init__(self, attack: Attack) -> None:
        super().__init__(f"PerExample({attack.attack})", attack.model)
        self.inner = attack
        self.supported_mode = ["default"]

    def forward(self, images: Tensor, labels: Tensor) -> Tensor:
        if images.shape[0] == 0:
            return images.clone().detach()
        views = [self.inner(images[i : i + 1], labels[i : i + 1]).detach() for i in range(images.shape[0])]
        return torch.cat(views)


def training_attack(attack: Attack) -> Attack:
    """The attack to run on private training data: ``attack`` itself, or CW wrapped in :class:`PerExampleAttack`.

    Raises:
        ValueError: ``attack`` couples the examples of a batch, is of a class not known to be separable, or targets
            labels chosen by a custom function; the message names the fix.
    """
    name = type(attack).__name__
    if isinstance(attack, PerExampleAttack):
        if _known(type(attack.inner)):
            return attack
        raise ValueError(
            f"PerExampleAttack({type(attack.inner).__name__}) wraps an attack class it does not know: "
            "it may keep state between examples; use one of the known attacks or declare it with "
            "register_separable_attack"
        )
    if attack.attack_mode not in _PER_EXAMPLE_MODES:
        raise ValueError(
            f"{name} in mode {attack.attack_mode!r} on training data: a custom target function may use "
            "other examples; use set_mode_default() or a per-example targeted mode"
        )
    cls = type(attack)
    if cls in SEPARABLE_ATTACKS or cls in _DECLARED:
        return attack
    if cls in PER_EXAMPLE_ATTACKS:
        return PerExampleAttack(attack)
    if cls in COUPLED_ATTACKS:
        raise ValueError(
            f"{name} cannot run on private training data: {COUPLED_ATTACKS[cls]}, so one example's view "
            "depends on the others and the clipped sum moves by more than max_grad_norm. Train with PGD, "
            f"or wrap it as PerExampleAttack({name}(...)) to run it one example at a time (B times slower)"
        )
    raise ValueError(
        f"{name} is not known to be example-separable, so it cannot run on private training data: use "
        f"one of {sorted(c.__name__ for c in SEPARABLE_ATTACKS)}, or check it with check_separability "
        f"and declare it with register_separable_attack({name}, reason)"
    )


def _known(cls: type[Attack]) -> bool:
    return any(cls in table for table in (SEPARABLE_ATTACKS, PER_EXAMPLE_ATTACKS, COUPLED_ATTACKS, _DECLARED))


class SeparabilityReport(NamedTuple):
    """Largest change of any other example's view when one example is changed, and when it is removed."""

    changed: float
    removed: float


def check_separability(
    attack: Attack, images: Tensor, labels: Tensor, index: int | None = None, seed: int = 0
) -> SeparabilityReport:
    """Run ``attack`` on a batch, on the batch with example ``index`` changed, and without it; compare the others.

    Every run starts from the same randomness (the global RNGs seeded with ``seed`` inside
    :func:`~lightning_dprobust.robustness.randomness.isolated_rng`, the attack's own generators reset), so for a
    separable attack ``changed`` is 0 up to floating-point rounding. ``removed`` also measures whether the batch size
    matters; it is exact only for an attack without random draws (turn random starts off for it), since a batch of
    ``B - 1`` examples consumes a random stream differently from a batch of ``B``.

    Args:
        attack: the attack, built on a model without cross-example layers.
        images: ``[B, ...]`` with ``B >= 2``. labels: ``[B]`` class indices or ``[B, L]`` label vectors.
        index: the example changed and removed (default ``B // 2``).
        seed: seed of the runs.
    """
    count = images.shape[0]
    index = count // 2 if index is None else index
    if count < 2 or not 0 <= index < count:
        raise ValueError(
            f"check_separability needs a batch of >= 2 examples and 0 <= index < B, got B={count}, index={index}"
        )
    changed_images, changed_labels = images.clone(), labels.clone()
    changed_images[index] = 1.0 - images[index]
    changed_labels[index] = labels[(index + 1) % count]
    keep = torch.arange(count) != index
    base = _seeded_run(attack, images, labels, seed)[keep]
    changed = _seeded_run(attack, changed_images, changed_labels, seed)[keep]
    removed = _seeded_run(attack, images[keep], labels[keep], seed)
    return SeparabilityReport((changed - base).abs().max().item(), (removed - base).abs().max().item())


def _seeded_run(attack: Attack, images: Tensor, labels: Tensor, seed: int) -> Tensor:
    generators = list(_generators(attack))
    states = [generator.get_state() for generator in generators]
    try:
        with isolated_rng(), torch.enable_grad():
            seed_everything_quietly(seed)
            return attack(images, labels).detach()
    finally:
        for generator, state in zip(generators, states, strict=True):
            generator.set_state(state)


def _generators(attack: Attack) -> Iterator[torch.Generator]:
    for candidate in (attack, *attack._attacks.values()):
        if isinstance(getattr(candidate, "generator", None), torch.Generator):
            yield candidate.generator


__all__ = [
    "COUPLED_ATTACKS",
    "PER_EXAMPLE_ATTACKS",
    "SEPARABLE_ATTACKS",
    "PerExampleAttack",
    "SeparabilityReport",
    "check_separability",
    "register_separable_attack",
    "training_attack",
]
