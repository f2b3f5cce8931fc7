"""Build a zoo entry from its recipe: train with the recipe config, evaluate, save the weights, update the catalog.

``dprobust zoo build NAME`` runs the same code path as ``dprobust fit --config <recipe config>`` (through
:class:`~lightning_dprobust.recipes.DProbustCLI`), then tests the final model on the data module's test split and reads
the privacy guarantee from :class:`~lightning_dprobust.callbacks.DPCallback`. The weights (the model's
``state_dict``: plain tensors only) go to ``<out>/weights/<name>-<sha8>.pth`` and the updated entry to
``<out>/entries/<name>.yaml``, where ``<out>`` is the caller's folder (the shipped ``zoo/`` directory only when
named). An entry of kind ``attack`` (an AIN generator) is scored by its attack success rate against its target instead
(:mod:`~lightning_dprobust.zoo.build_attack`).

A recipe is ``meta.recipe``: ``config`` (a path relative to the repository root), ``overrides`` (a mapping from
dotted config paths to values, applied to the YAML before parsing; a list element is chosen by index or by the
class name at the end of its ``class_path``, e.g. ``dp.target_epsilon`` or
``trainer.callbacks.ModelCheckpoint.init_args.save_last``),
``config_sha256`` (:func:`config_sha256`: of the config as the CLI resolves it, the base trainer config included) and
``commit`` (the git commit checked out when it was built).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from lightning_dprobust.core.accounting import LedgerOwner
from lightning_dprobust.zoo.build_attack import train_and_evaluate_attack
from lightning_dprobust.zoo.catalog import Entry, ZooError
from lightning_dprobust.zoo.hub import ZOO_DIR, Zoo, fit_state_dict, sha256_file

REPO_ROOT = ZOO_DIR.parent
ATTACK_SEEDS = (0, 1, 2)
"""Seeds of the random starts over which a build averages robust accuracy."""
CERTIFICATION = {"n0": 100, "n": 10_000, "alpha": 0.001, "skip": 1}
"""Certification settings of a build, unless the entry's ``meta.certification`` overrides some of them."""


def apply_override(config: dict[str, Any], dotted: str, value: Any) -> None:
    """Set ``value`` at the dotted path ``dotted`` of ``config`` in place, creating missing mapping keys.

    Raises:
        ZooError: if a list element named in the path (by index or class name) does not exist.
    """
    node: Any = config
    parts = dotted.split(".")
    for position, part in enumerate(parts):
        last = position == len(parts) - 1
        if isinstance(node, list):
            index = _list_index(node, part, dotted)
            if last:
                node[index] = value
            node = node[index]
        elif last:
            node[part] = value
        else:
            node = node.setdefault(part, {})


def _list_index(items: list[Any], part: str, dotted: str) -> int:
    if part.lstrip("-").isdigit() and -len(items) <= int(part) < len(items):
        return int(part)
    matches = [
        i
        for i, item in enumerate(items)
        if isinstance(item, dict) and str(item.get("class_path", "")).rsplit(".", 1)[-1] == part
    ]
    if len(matches) != 1:
        classes = [item.get("class_path") for item in items if isinstance(item, dict)]
        raise ZooError(
            f"recipe override {dotted!r}: {part!r} must be an index below {len(items)} or the class name of exactly "
            f"one element of the list, whose class paths are {classes}"
        )
    return matches[0]


def recipe_config(entry: Entry, *, epochs: int | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """The entry's recipe config with its overrides (plus ``trainer.max_epochs`` when ``epochs`` is given).

    Returns:
        The config as a dict ready to be dumped to YAML, and the overrides that were applied.

    Raises:
        ZooError: if the config file does not exist, or an override names a missing list element.
    """
    path = REPO_ROOT / entry.meta["recipe"]["config"]
    if not path.is_file():
        raise ZooError(
            f"recipe config {path} of zoo entry {entry.name!r} does not exist; its method "
            f"({entry.meta['method']}) may not be implemented yet. Write the config, then build again"
        )
    from lightning_dprobust.recipes import composed_config  # its base trainer settings included

    config = composed_config(path)
    overrides = dict(entry.meta["recipe"].get("overrides") or {})
    if epochs is not None:
        if epochs < 1:
            raise ZooError(f"epochs must be >= 1, got {epochs}")
        overrides["trainer.max_epochs"] = int(epochs)
    for dotted, value in overrides.items():
        apply_override(config, dotted, value)
    return config, overrides


def git_commit(root: Path = REPO_ROOT) -> str | None:
    """The commit checked out in the git repository at ``root``, read from ``.git`` (``None`` outside git)."""
    git = root / ".git"
    if git.is_file():
        git = (root / git.read_text().split(":", 1)[1].strip()).resolve()
    if not (git / "HEAD").is_file():
        return None
    head = (git / "HEAD").read_text().strip()
    if not head.startswith("ref: "):
        return head
    ref = head[len("ref: ") :]
    bases = [git]
    if (git / "commondir").is_file():
        bases.append((git / (git / "commondir").read_text().strip()).resolve())
    for base in bases:
        if (base / ref).is_file():
            return (base / ref).read_text().strip()
        if (base / "packed-refs").is_file():
            for line in (base / "packed-refs").read_text().splitlines():
                if line.endswith(" " + ref):
                    return line.split()[0]
    return None


def train_and_evaluate(
    config: dict[str, Any], workdir: Path, evaluation: dict[str, Any] | None = None
) -> tuple[nn.Module, dict[str, float], dict | None]:
    """Fit the config as ``dprobust fit`` would (no logger, files under ``workdir``) and evaluate the final model.

    Metrics: ``test_acc`` always; with ``evaluation["smoothing"] = {"sigma": s}`` the certified accuracy at radii
    0 / 0.25 / 0.5 / 0.75 and the ACR of the test split (:data:`CERTIFICATION` updated by
    ``evaluation["certification"]``, generator seed 0); with ``evaluation["robustness"] = {"attack": name, "eps": e,
    ...}`` the robust accuracy under that attack, mean and sample standard deviation (key suffix ``_std``) over the
    random starts seeded with :data:`ATTACK_SEEDS`.

    Returns:
        The trained model (the module's ``model``), the metrics, and the privacy record of its ``DPCallback`` or of
        the module's own ledger (``None`` for a non-private run).
    """
    from lightning_dprobust.recipes import fit_recipe, quiet_overrides

    fitted = fit_recipe(config, quiet_overrides(workdir))
    module = fitted.module.eval()
    metrics = {"test_acc": round(float(fitted.test["test/acc"]), 6)}
    evaluation = evaluation or {}
    if evaluation.get("smoothing"):
        metrics |= _certified_metrics(
            module, fitted.datamodule.test_set, evaluation["smoothing"]["sigma"], evaluation.get("certification")
        )
    if evaluation.get("robustness"):
        metrics |= _robust_metrics(module, fitted.datamodule.test_dataloader(), **evaluation["robustness"])
    privacy = module_privacy_record(fitted.trainer) if fitted.privacy is None else privacy_record(fitted.privacy)
    return module.model, metrics, privacy


def _certified_metrics(
    module: nn.Module, test_set: Any, sigma: float, certification: dict[str, Any] | None
) -> dict[str, float]:
    from lightning_dprobust.robustness.certify import certify_dataset, summarize

    settings = CERTIFICATION | (certification or {})
    rows = certify_dataset(module, test_set, sigma=sigma, batch_size=1000, seed=0, progress=True, **settings)
    summary = summarize(rows, (0.0, 0.25, 0.5, 0.75))
    return {key: round(float(value), 6) for key, value in summary.items() if key != "num_examples"}


def _robust_metrics(module: nn.Module, loader: Any, attack: str, eps: float, **kwargs: Any) -> dict[str, float]:
    from lightning_dprobust.robustness.attacks import build_attack, robust_accuracy

    accuracies = []
    for seed in ATTACK_SEEDS:
        suite = {attack: build_attack(attack, module, eps, **kwargs)}
        accuracies.append(robust_accuracy(module, loader, suite, seed=seed)[attack])  # seed: the random start
    key = f"{attack.lower()}_{eps:g}_acc"
    return {key: round(float(np.mean(accuracies)), 6), f"{key}_std": round(float(np.std(accuracies, ddof=1)), 6)}


def train_and_evaluate_generator(config: dict[str, Any], workdir: Path) -> tuple[nn.Module, dict[str, float], dict]:
    """Fit an EHR generator's config as ``dprobust fit`` would and score its released artifact against the test
    split (:func:`~lightning_dprobust.metrics.synthetic_eval.evaluate_generator`, seed 0).

    Returns:
        The released artifact (what the entry publishes), its similarity metrics and the module's privacy record.
    """
    from lightning_dprobust.metrics.synthetic_eval import evaluate_generator
    from lightning_dprobust.recipes import fit_recipe, quiet_overrides

    fitted = fit_recipe(config, quiet_overrides(workdir), test=False)
    release = fitted.module.release().cpu()
    report, _ = evaluate_generator(release, fitted.datamodule.test_set.tensors)
    metrics = {key.removeprefix("synthetic/").replace("/", "_"): round(value, 6) for key, value in report.items()}
    return release, metrics, privacy_record(fitted.module)


def privacy_record(dp: Any) -> dict[str, Any]:
    """The guarantee a fitted ``DPCallback`` (or a generative module, which has the same attributes) gives, as the
    zoo's ``meta.privacy`` (plain floats and ints), with its randomness (:func:`randomness_record`). A TransDenoiser
    trained with its data-dependent top-up (no guarantee) records the epsilon of the noise it added, as nominal."""
    from lightning_dprobust.callbacks.transdenoiser import TransDenoiserCallback

    epsilon, accountant = dp.epsilon(), dp.accountant
    if isinstance(dp, TransDenoiserCallback) and math.isinf(epsilon) and not dp.thesis_accounting:
        epsilon, accountant = dp.added_noise_epsilon(), "nominal"
    return randomness_record(dp) | {
        "epsilon": float(epsilon),
        "delta": float(dp.delta),
        "accountant": accountant,
        "noise_multiplier": float(dp.noise_multiplier),
        "max_grad_norm": float(dp.max_grad_norm),
        "sample_rate": float(dp.loaders.sample_rate),
        "steps": int(dp.ledger.steps),
    }


def randomness_record(owner: Any) -> dict[str, str]:
    """``{"randomness_mode": label}`` of ``owner``'s DP randomness when it has one, else ``{}``: ``secret``, or for a
    seeded run :data:`~lightning_dprobust.core.sampling.SEEDED_LABEL`. The seed itself is not written: the
    record says that it is known (it is in the recipe config) and what that costs."""
    from lightning_dprobust.callbacks.dp_randomness import DPRandomness

    randomness = getattr(owner, "randomness", None)
    return {"randomness_mode": randomness.label} if isinstance(randomness, DPRandomness) else {}


def module_privacy_record(trainer: Any) -> dict[str, Any] | None:
    """The guarantee of a module-owned ledger (e.g. StoBatch's pure-DP Laplace releases) as ``meta.privacy``;
    ``None`` for a non-private run. Pure DP has ``delta`` 0 and the accountant ``"laplace"`` (basic composition)."""
    from lightning_dprobust.callbacks.run import privacy_owner

    owner = privacy_owner(trainer)
    if owner is None:
        return nominal_privacy_record(trainer)
    return randomness_record(trainer.lightning_module) | {
        "epsilon": float(owner.epsilon()),
        "delta": float(owner.delta),
        "accountant": owner.accountant if owner.ledger.steps else "laplace",
        "noise_multiplier": None,
        "max_grad_norm": None,
        "sample_rate": None,
        "steps": int(trainer.global_step),
    }


def nominal_privacy_record(trainer: Any) -> dict[str, Any] | None:
    """A module's nominal claim as ``meta.privacy`` with the accountant ``"nominal"`` (shown as no DP guarantee), for
    a module that asks for it (``zoo_nominal_privacy = True``: StoBatch with batch normalization); ``None`` otherwise
    (other nominal claims stay ``null`` with a note)."""
    module = trainer.lightning_module
    if not (isinstance(module, LedgerOwner) and getattr(module, "zoo_nominal_privacy", False)):
        return None
    if len(module.ledger.nominal) != 1:
        return None
    claim = module.ledger.nominal[0]
    return {
        "epsilon": claim.epsilon,
        "delta": claim.delta,
        "accountant": "nominal",
        "noise_multiplier": None,
        "max_grad_norm": None,
        "sample_rate": None,
        "steps": int(trainer.global_step),
    }


def save_weights(model: nn.Module, weights_dir: Path, name: str) -> tuple[str, str]:
    """Save ``model.state_dict()`` (CPU tensors only) as ``<weights_dir>/<name>-<sha8>.pth``; return file and sha."""
    state = {key: value.detach().cpu().clone().contiguous() for key, value in model.state_dict().items()}
    weights_dir.mkdir(parents=True, exist_ok=True)
    handle, partial = tempfile.mkstemp(prefix=f".{name}.", suffix=".part", dir=weights_dir)
    os.close(handle)
    try:
        torch.save(state, partial)
        sha = sha256_file(partial)
        file = f"{name}-{sha[:8]}.pth"
        os.chmod(partial, 0o644)  # published files are world-readable (mkstemp creates them 0600)
        os.replace(partial, weights_dir / file)
    finally:
        Path(partial).unlink(missing_ok=True)
    return file, sha


def config_sha256(config: str) -> str:
    """SHA-256 of the recipe ``config`` (a path relative to the repository root) as ``dprobust fit`` resolves it: the
    base trainer config with the recipe file over it (:func:`~lightning_dprobust.recipes.composed_config`), as
    canonical JSON. A change to either file changes it; a change of formatting or comments does not."""
    from lightning_dprobust.recipes import composed_config

    canonical = json.dumps(composed_config(REPO_ROOT / config), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def build(name: str, *, out_dir: str | os.PathLike, epochs: int | None = None, zoo: Zoo | None = None) -> Entry:
    """Train, evaluate and publish the zoo entry ``name`` from its recipe; return the updated entry.

    Args:
        name: a catalog entry (shipped or recipe).
        epochs: override ``trainer.max_epochs`` (recorded in the entry's recipe overrides).
        out_dir: zoo directory that receives ``weights/`` and ``entries/``; required, so the shipped catalog
            (``zoo.catalog_dir``) is written only when named (``dprobust zoo build`` also asks for ``--overwrite``).
        zoo: the catalog to read the entry from (default: the shipped one).

    Raises:
        ZooError: if the recipe cannot be built; ``CatalogError`` if its model does not match the entry's ``model``.
    """
    zoo = zoo or Zoo()
    entry = zoo.info(name)
    out = Path(out_dir)
    config, overrides = recipe_config(entry, epochs=epochs)
    with tempfile.TemporaryDirectory(prefix="dprobust-zoo-build-") as workdir:
        evaluation = {key: entry.meta.get(key) for key in ("smoothing", "robustness", "certification")}
        if entry.kind == "generator":
            model, metrics, privacy = train_and_evaluate_generator(config, Path(workdir))
        elif entry.kind == "attack":
            model, metrics, privacy = train_and_evaluate_attack(config, Path(workdir), entry)
        else:
            model, metrics, privacy = train_and_evaluate(config, Path(workdir), evaluation)
    fresh = entry.build_model()
    fit_state_dict(
        fresh, model.state_dict(), f"the recipe of {name!r} trains another model than the entry's {entry.model}"
    )
    file, sha = save_weights(model, out / "weights", name)
    recipe = {
        **entry.meta["recipe"],
        "overrides": overrides or None,
        "config_sha256": config_sha256(entry.meta["recipe"]["config"]),
        "commit": git_commit(),
    }
    meta = {
        **entry.meta,
        "num_params": sum(p.numel() for p in fresh.parameters()),
        "metrics": metrics,
        "privacy": privacy,
        "recipe": recipe,
    }
    if entry.kind == "attack" and entry.meta.get("robustness"):
        meta["robustness"] = {**entry.meta["robustness"], "eps": metrics["bound"]}  # the bound the AIN reached
    updated = Entry.from_dict(
        dataclasses.replace(entry, status="shipped", url=f"weights/{file}", file=file, sha256=sha, meta=meta).to_dict(),
        name,
    )
    (out / "entries").mkdir(parents=True, exist_ok=True)
    (out / "entries" / f"{name}.yaml").write_text(updated.to_yaml())
    if entry.file and entry.file != file:
        (out / "weights" / entry.file).unlink(missing_ok=True)
    return updated
