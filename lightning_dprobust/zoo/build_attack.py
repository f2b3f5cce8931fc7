"""Build a zoo entry of kind ``attack`` (a trained AIN generator; Tang 2021, PhD thesis, Emory University, chapter 5)
from its recipe: fit the AIN config as ``dprobust fit`` would, then measure the generator's attack success rate.

Part of :mod:`lightning_dprobust.zoo.build` (``dprobust zoo build NAME`` calls :func:`train_and_evaluate_attack` for
an entry of kind ``attack``).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from torch import nn

from lightning_dprobust.zoo.catalog import Entry, ZooError

ATTACK_BOUNDS = (0.1, 0.2, 0.3)
"""Linf bounds at which a build measures an AIN's success rate (with those of the entry's ``target_metrics``), each
only when it is at least the bound the AIN was trained down to."""
_SUCCESS_KEY = re.compile(r"^success@(?P<eps>[0-9.]+)$")


def train_and_evaluate_attack(config: dict[str, Any], workdir: Path, entry: Entry) -> tuple[nn.Module, dict, None]:
    """Fit an AIN config as ``dprobust fit`` would (no logger, files under ``workdir``) and score its generator.

    Metrics: ``bound``, the bound the AIN reached, and ``success@<eps>`` for each bound of :func:`attack_bounds`
    (:func:`~lightning_dprobust.robustness.ain_attack.success_rate` of ``AINAttack(target, generator, eps, seed=0)`` on
    the data module's test split against the AIN's frozen target: targeted, the fraction of the examples of other
    classes classified as the target class; untargeted, the fraction misclassified).

    Returns:
        The entry's model (``create_model("ain_generator", ...)``: the generator behind an identity normalization)
        with the trained weights, the metrics, and ``None`` (AIN's training is not private).

    Raises:
        ZooError: the recipe trains an AIN of another target class than the entry's ``meta.robustness.target_class``.
    """
    from lightning_dprobust.recipes import fit_recipe, quiet_overrides

    fitted = fit_recipe(config, quiet_overrides(workdir), test=False)
    module = fitted.module.cpu().eval()  # scored on the CPU, as the test split's batches come
    generator = module.generator
    _check_target_class(entry, module.target_class)
    model = entry.build_model()
    model.net.load_state_dict(generator.state_dict())
    bound = round(float(generator.bound), 6)
    metrics: dict[str, float] = {"bound": bound}
    for eps in attack_bounds(entry, bound):
        rate = _success(module.target, generator, fitted.datamodule.test_dataloader(), eps)
        metrics[f"success@{eps:g}"] = round(rate, 6)
    return model, metrics, None


def attack_bounds(entry: Entry, bound: float) -> list[float]:
    """:data:`ATTACK_BOUNDS` and the bounds named by the entry's ``target_metrics`` (``success@<eps>``), sorted,
    keeping those at least ``bound`` (an AIN attacks only at bounds at least the one it was trained down to)."""
    named = {
        float(match["eps"]) for key in entry.meta.get("target_metrics") or {} if (match := _SUCCESS_KEY.match(key))
    }
    return sorted(eps for eps in set(ATTACK_BOUNDS) | named if eps >= bound - 1e-6)


def _check_target_class(entry: Entry, trained: int | None) -> None:
    expected = (entry.meta.get("robustness") or {}).get("target_class", trained)
    if expected != trained:
        raise ZooError(
            f"the recipe of {entry.name!r} trains an AIN with target_class {trained}, but the entry's "
            f"meta.robustness.target_class is {expected}: fix the recipe overrides (model.init_args.target_class)"
        )


def _success(target: nn.Module, generator: nn.Module, loader: Any, eps: float) -> float:
    from lightning_dprobust.robustness.ain_attack import AINAttack, success_rate

    attack = AINAttack(target, generator, eps, seed=0)
    hits, count = 0.0, 0
    for batch in loader:
        x, y = batch[0], batch[1]
        counted = len(y) if attack.target_class is None else int((y != attack.target_class).sum())
        if counted:  # success_rate averages over the counted examples of the batch
            hits += success_rate(target, attack(x, y), y, attack.target_class) * counted
            count += counted
    return hits / count if count else float("nan")


__all__ = ["ATTACK_BOUNDS", "attack_bounds", "train_and_evaluate_attack"]
