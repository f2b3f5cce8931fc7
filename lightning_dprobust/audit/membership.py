"""Membership-inference attacks on a trained classifier, given its members (train data) and non-members.

Three attacks, each producing one score per example (higher: more likely a member):

* ``loss``: the loss-threshold attack of Yeom, Giacomelli, Fredrikson, Jha 2018, "Privacy Risk in Machine Learning"
  (https://arxiv.org/abs/1709.01604): score = minus the cross-entropy of the true label.
* ``shadow``: the shadow-model attack of Salem, Zhang, Humbert, Berrang, Fritz, Backes 2019, "ML-Leaks"
  (https://arxiv.org/abs/1806.01246), as used by the residual-perturbation paper: shadow models trained like the
  target on half of a disjoint shadow pool; their sorted top-3 softmax probabilities on the pool, labelled in/out,
  train a small MLP; its member probability on the target's outputs is the score.
* ``lira``: offline LiRA of Carlini, Chien, Nasr, Song, Terzis, Tramer 2022, "Membership Inference Attacks From
  First Principles" (https://arxiv.org/abs/2112.03570), their offline variant of Algorithm 1 (no IN models): a Gaussian
  fitted to the logit-scaled true-class confidence ``phi = log(p / (1 - p))`` of each example across shadow models
  that never saw it; score = the one-sided test ``Phi((phi_target - mu) / sigma)``, returned as the z-score (the same
  ranking without saturating at 1). With fewer than 64 shadow models one global variance is used, as the paper
  recommends.

Training is abstracted as ``train_fn(indices) -> model`` (:data:`TrainFn`), so the attacks do not depend on how
models are trained; :mod:`lightning_dprobust.audit.runner` provides one that follows a Lightning recipe.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.data import DataLoader, Dataset
from tqdm.auto import tqdm

from lightning_dprobust.audit.roc import RocMetrics, roc_metrics

TrainFn = Callable[[np.ndarray], nn.Module]
"""Trains a fresh model on the examples at the given indices of the audited dataset and returns it."""
ATTACKS = ("loss", "shadow", "lira")
TOP_K = 3
GLOBAL_VARIANCE_BELOW = 64
"""LiRA uses one variance for all examples when it has fewer shadow models than this (Carlini et al. 2022)."""


@dataclass(frozen=True)
class AuditSplit:
    """Indices into the audited dataset: evaluated members and non-members, and the shadow pool (disjoint)."""

    members: np.ndarray
    nonmembers: np.ndarray
    shadow_pool: np.ndarray

    @property
    def targets(self) -> np.ndarray:
        """Evaluated examples: members first, then non-members."""
        return np.concatenate([self.members, self.nonmembers])

    @property
    def is_member(self) -> np.ndarray:
        """Membership of :attr:`targets`."""
        return np.r_[np.ones(len(self.members), bool), np.zeros(len(self.nonmembers), bool)]


def split_for_audit(members: np.ndarray, nonmembers: np.ndarray, seed: int = 0) -> AuditSplit:
    """Evaluate ``n = min(#non-members, #members // 2)`` random examples of each kind; the rest is the shadow pool.

    The evaluation is balanced (AUC and balanced accuracy have chance level 0.5) and the shadow pool, drawn from the
    same distribution, never contains an evaluated example, so every shadow model is an OUT model for every target.
    """
    members, nonmembers = np.asarray(members), np.asarray(nonmembers)
    if np.intersect1d(members, nonmembers).size:
        raise ValueError("members and non-members overlap: an example cannot be both")
    count = min(len(nonmembers), len(members) // 2)
    if count < 1:
        raise ValueError(f"need at least 2 members and 1 non-member, got {len(members)} and {len(nonmembers)}")
    rng = np.random.default_rng(seed)
    members, nonmembers = rng.permutation(members), rng.permutation(nonmembers)
    pool = np.sort(np.concatenate([members[count:], nonmembers[count:]]))
    return AuditSplit(np.sort(members[:count]), np.sort(nonmembers[:count]), pool)


@torch.no_grad()
def model_outputs(
    model: nn.Module, dataset: Dataset, batch_size: int = 1024, device: str | torch.device = "cpu"
) -> tuple[Tensor, Tensor]:
    """``(logits, labels)`` of every example of ``dataset``, in order, on the CPU; the model runs in eval mode."""
    was_training = model.training
    model.eval().to(device)
    logits, labels = [], []
    try:
        for x, y in DataLoader(dataset, batch_size=batch_size):
            logits.append(model(x.to(device)).float().cpu())
            labels.append(y)
    finally:
        model.train(was_training)
    return torch.cat(logits), torch.cat(labels)


def loss_scores(logits: Tensor, labels: Tensor) -> np.ndarray:
    """Yeom et al. 2018: minus the cross-entropy of the true label."""
    return (-F.cross_entropy(logits, labels, reduction="none")).numpy()


def logit_confidence(logits: Tensor, labels: Tensor) -> Tensor:
    """``phi = log(p_y / (1 - p_y))`` computed stably as ``z_y - logsumexp_{j != y} z_j``; works on ``[..., N, C]``."""
    true = logits.gather(-1, labels.expand(logits.shape[:-1]).unsqueeze(-1)).squeeze(-1)
    others = logits.scatter(-1, labels.expand(logits.shape[:-1]).unsqueeze(-1), float("-inf"))
    return true - torch.logsumexp(others, dim=-1)


def top_k_features(logits: Tensor, k: int = TOP_K) -> np.ndarray:
    """The ``k`` largest softmax probabilities of each example, in descending order (Salem et al. 2019)."""
    k = min(k, logits.shape[-1])
    return torch.softmax(logits, dim=-1).topk(k, dim=-1).values.numpy()


@dataclass(frozen=True)
class ShadowModels:
    """Outputs of shadow models on the whole audited dataset.

    Attributes:
        logits: ``[S, N, C]`` logits of each shadow model on every example.
        included: ``[S, N]`` whether the example was in that shadow model's training set.
    """

    logits: Tensor
    included: np.ndarray


def train_shadow_models(
    train_fn: TrainFn,
    predict: Callable[[nn.Module], Tensor],
    pool: np.ndarray,
    num_shadows: int,
    seed: int = 0,
    shadow_size: int | None = None,
) -> ShadowModels:
    """Train ``num_shadows`` models, each on a fresh uniformly random subset of ``pool`` (default: half of it).

    Args:
        train_fn: trains a model on the given indices.
        predict: the logits of a model on every example of the audited dataset, ``[N, C]``.
        pool: indices the shadow models may train on.
        num_shadows: number of models.
        seed: seed of the subsets.
        shadow_size: examples per shadow model, in ``[1, len(pool))``; match the target's training-set size when
            the pool allows it (Salem et al. and Carlini et al. do).
    """
    size = len(pool) // 2 if shadow_size is None else shadow_size
    if num_shadows < 1:
        raise ValueError(f"num_shadows must be >= 1, got {num_shadows}")
    if not 1 <= size < len(pool):
        raise ValueError(f"shadow_size must lie in [1, {len(pool)}) (the shadow pool leaves some out), got {size}")
    rng = np.random.default_rng(seed)
    logits, included = [], []
    for _ in tqdm(range(num_shadows), desc="shadow models", unit="model", leave=False):
        chosen = np.sort(rng.choice(pool, size=size, replace=False))
        outputs = predict(train_fn(chosen))
        mask = np.zeros(len(outputs), dtype=bool)
        mask[chosen] = True
        logits.append(outputs)
        included.append(mask)
    return ShadowModels(torch.stack(logits), np.stack(included))


def shadow_attack_scores(shadows: ShadowModels, pool: np.ndarray, target_logits: Tensor, seed: int = 0) -> np.ndarray:
    """Salem et al. 2019: an MLP (64 hidden units) on sorted top-3 probabilities, trained on shadow in/out.

    The MLP is scikit-learn's ``MLPClassifier`` (ReLU, Adam at its default learning rate 1e-3, up to 200 epochs),
    not the residual-perturbation paper's Adam at lr 0.1 for 50 epochs, which on digits gave lower AUCs that varied
    with the MLP's seed (0.56-0.62 against 0.655 on an overfit target).
    Returns the attack model's member probability for each row of ``target_logits``.
    """
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.neural_network import MLPClassifier

    features = np.concatenate([top_k_features(logits[pool]) for logits in shadows.logits])
    labels = np.concatenate([included[pool] for included in shadows.included])
    if labels.all() or not labels.any():
        raise ValueError("the shadow models' pool data must contain both in and out examples")
    attack = MLPClassifier(hidden_layer_sizes=(64,), max_iter=200, random_state=seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        attack.fit(features, labels)
    return attack.predict_proba(top_k_features(target_logits))[:, 1]


def lira_offline_scores(
    shadows: ShadowModels,
    targets: np.ndarray,
    labels: Tensor,
    target_logits: Tensor,
    global_variance: bool | None = None,
) -> np.ndarray:
    """Offline LiRA (Carlini et al. 2022): z-score of each target's ``phi`` under its OUT Gaussian.

    Args:
        shadows: models none of which trained on any of ``targets``.
        targets: indices of the evaluated examples in the audited dataset.
        labels: true labels of ``targets``.
        target_logits: the target model's logits on ``targets``.
        global_variance: one pooled variance for all examples; default when fewer than 64 shadow models.

    Raises:
        ValueError: with fewer than 2 shadow models, or if a shadow model trained on a target.
    """
    if shadows.included[:, targets].any():
        raise ValueError("offline LiRA needs OUT models: a shadow model was trained on an evaluated example")
    count = shadows.logits.shape[0]
    if count < 2:
        raise ValueError(f"offline LiRA fits a Gaussian across shadow models: need at least 2, got {count}")
    phi_out = logit_confidence(shadows.logits[:, targets], labels).double().numpy()
    mean = phi_out.mean(axis=0)
    variance = phi_out.var(axis=0, ddof=1)
    if global_variance if global_variance is not None else count < GLOBAL_VARIANCE_BELOW:
        variance = np.full_like(variance, variance.mean())
    std = np.sqrt(np.maximum(variance, 1e-12))
    phi = logit_confidence(target_logits, labels).double().numpy()
    return (phi - mean) / std


@dataclass(frozen=True)
class MembershipReport:
    """ROC metrics and raw scores of each attack on one target model.

    Attributes:
        metrics: ``{attack: RocMetrics}``.
        scores: ``{attack: scores of split.targets}``.
        split: the evaluated examples and the shadow pool.
        num_shadows: shadow models trained (0 for the loss attack alone).
    """

    metrics: dict[str, RocMetrics]
    scores: dict[str, np.ndarray]
    split: AuditSplit
    num_shadows: int


def _check_attacks(attacks: Sequence[str], num_shadows: int) -> list[str]:
    unknown = sorted(set(attacks) - set(ATTACKS))
    if unknown or not attacks:
        raise ValueError(f"attacks must be a non-empty subset of {ATTACKS}, got {list(attacks)}")
    if "lira" in attacks and num_shadows < 2:
        raise ValueError(f"the lira attack needs at least 2 shadow models, got num_shadows={num_shadows}")
    if "shadow" in attacks and num_shadows < 1:
        raise ValueError("the shadow attack needs at least 1 shadow model (num_shadows >= 1)")
    return [name for name in ATTACKS if name in attacks]


def membership_audit(
    target: nn.Module,
    dataset: Dataset,
    members: np.ndarray,
    nonmembers: np.ndarray,
    train_fn: TrainFn | None = None,
    num_shadows: int = 8,
    attacks: Sequence[str] = ATTACKS,
    seed: int = 0,
    device: str | torch.device = "cpu",
    shadow_size: int | None = None,
) -> MembershipReport:
    """Run the membership-inference ``attacks`` on ``target``, trained on ``members`` of ``dataset``.

    Args:
        target: the trained model (maps a batch of inputs to logits).
        dataset: every example involved: members, non-members and any other data the attacker may use.
        members: indices of the examples ``target`` trained on.
        nonmembers: indices of examples it did not train on, from the same distribution.
        train_fn: trains a shadow model on given indices of ``dataset`` like the target was trained (same
            architecture and recipe); needed by ``shadow`` and ``lira``.
        num_shadows: shadow models to train (shared by ``shadow`` and ``lira``).
        attacks: a subset of :data:`ATTACKS`.
        seed: seed of the evaluation split, of the shadow halves and of the attack MLP.
        device: where the models run for inference.
        shadow_size: examples per shadow model (default: half the shadow pool).

    Guarantees: the evaluated examples are balanced and never in a shadow model's training set
    (:func:`split_for_audit`).
    """
    attacks = _check_attacks(attacks, num_shadows)
    split = split_for_audit(members, nonmembers, seed)
    logits, labels = model_outputs(target, dataset, device=device)
    targets = split.targets
    scores = {"loss": loss_scores(logits[targets], labels[targets])} if "loss" in attacks else {}
    shadow_attacks = [name for name in attacks if name != "loss"]
    if shadow_attacks:
        if train_fn is None:
            raise ValueError("the shadow and lira attacks need train_fn to train shadow models")

        def predict(model: nn.Module) -> Tensor:
            return model_outputs(model, dataset, device=device)[0]

        shadows = train_shadow_models(train_fn, predict, split.shadow_pool, num_shadows, seed, shadow_size)
        scores.update(_shadow_based_scores(shadow_attacks, shadows, split, labels[targets], logits[targets], seed))
    metrics = {name: roc_metrics(scores[name], split.is_member) for name in attacks}
    return MembershipReport(
        metrics, {name: scores[name] for name in attacks}, split, num_shadows if shadow_attacks else 0
    )


def _shadow_based_scores(
    attacks: Sequence[str], shadows: ShadowModels, split: AuditSplit, labels: Tensor, logits: Tensor, seed: int
) -> dict[str, np.ndarray]:
    scores = {}
    if "shadow" in attacks:
        scores["shadow"] = shadow_attack_scores(shadows, split.shadow_pool, logits, seed)
    if "lira" in attacks:
        scores["lira"] = lira_offline_scores(shadows, split.targets, labels, logits)
    return scores
