"""The membership audit of residual perturbation (Tao et al., ICLR 2021 submission, section 4.1): the shadow-model
attack of Salem, Zhang, Humbert, Berrang, Fritz, Backes 2019, "ML-Leaks" (https://arxiv.org/abs/1806.01246), with
the paper's exact splits and attack network.

Protocol:

1. the training set is split into ``D_shadow`` and ``D_target`` of equal size, and each into equal ``in``/``out``
   halves (CIFAR: 50,000 -> 25,000 -> 12,500; IDC: 39,952 -> 19,976 -> 9,988), all disjoint;
2. the shadow model trains on ``D_shadow^in`` like the target; its top-``k`` sorted probabilities on all of
   ``D_shadow`` (``k = 3``, or 2 for binary data), labelled in/out, train a ``k -> 64 -> 2`` MLP (ReLU, softmax
   output) for 50 epochs of Adam at learning rate 0.1 (the paper's settings);
3. the target trains on ``D_target^in``; the MLP's member probability on all of ``D_target`` gives the AUC, and
   precision and recall at each decision threshold (default 0.5, 0.6, 0.7, 0.8).

:func:`salem_audit` runs the whole protocol (it trains the target too); :func:`salem_checkpoint_audit` runs it on a
target that is already trained (a checkpoint, e.g. ``dprobust audit --ckpt ... --attack salem``).

The features and ROC metrics are those of :mod:`lightning_dprobust.audit.membership` and
:mod:`lightning_dprobust.audit.roc`. The MLP trains on its own generator, so the audit never touches the
global random state.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.data import Dataset, Subset

from lightning_dprobust.audit.membership import model_outputs, split_for_audit, top_k_features
from lightning_dprobust.audit.roc import RocMetrics, roc_metrics

THRESHOLDS = (0.5, 0.6, 0.7, 0.8)
"""Decision thresholds on the attack's member probability (the paper's four, whose values it does not state)."""


@dataclass(frozen=True)
class SalemSplit:
    """Disjoint index sets: the shadow model's ``in``/``out`` halves and the target's."""

    shadow_in: np.ndarray
    shadow_out: np.ndarray
    target_in: np.ndarray
    target_out: np.ndarray


def salem_split(num_examples: int, seed: int = 0) -> SalemSplit:
    """Shuffle ``range(num_examples)`` and cut it into four disjoint quarters of ``(num_examples // 2) // 2``."""
    if num_examples < 4:
        raise ValueError(f"the Salem et al. split needs at least 4 examples, got {num_examples}")
    half = num_examples // 2
    quarter = half // 2
    order = np.random.default_rng(seed).permutation(num_examples)
    shadow, target = order[:half], order[half : 2 * half]
    return SalemSplit(shadow[:quarter], shadow[quarter : 2 * quarter], target[:quarter], target[quarter : 2 * quarter])


class AttackMLP(nn.Module):
    """``k -> 64 -> 2``: ReLU hidden layer, two logits (non-member, member); softmax gives the member probability."""

    def __init__(self, num_features: int, hidden: int = 64) -> None:
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(num_features, hidden), nn.ReLU(), nn.Linear(hidden, 2))

    def forward(self, features: Tensor) -> Tensor:
        """Logits ``[N, 2]``."""
        return self.layers(features)

    def member_probability(self, features: np.ndarray) -> np.ndarray:
        """Softmax probability of "member" for each row of ``features``."""
        with torch.no_grad():
            return torch.softmax(self(torch.as_tensor(features, dtype=torch.float32)), dim=1)[:, 1].numpy()


def train_attack_mlp(
    features: np.ndarray, labels: np.ndarray, epochs: int = 50, lr: float = 0.1, batch_size: int = 128, seed: int = 0
) -> AttackMLP:
    """Train :class:`AttackMLP` with Adam on ``(features, labels)`` (1 = member); returns it in eval mode."""
    if epochs < 1 or not lr > 0 or batch_size < 1:
        raise ValueError(f"need epochs >= 1, lr > 0 and batch_size >= 1, got {epochs}, {lr}, {batch_size}")
    generator = torch.Generator().manual_seed(seed)
    x = torch.as_tensor(features, dtype=torch.float32)
    y = torch.as_tensor(labels, dtype=torch.long)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AttackMLP(x.shape[1])
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    for _ in range(epochs):
        for batch in torch.randperm(len(x), generator=generator).split(batch_size):
            optimizer.zero_grad()
            F.cross_entropy(model(x[batch]), y[batch]).backward()
            optimizer.step()
    return model.eval()


@dataclass(frozen=True)
class SalemReport:
    """The attack's ROC metrics on ``D_target`` and its precision and recall at each threshold."""

    roc: RocMetrics
    precision: dict[float, float]
    recall: dict[float, float]
    scores: np.ndarray
    is_member: np.ndarray

    @property
    def collapsed(self) -> bool:
        """Whether the attack MLP gave every target example the same score (AUC 0.5 then means no signal found)."""
        return bool(np.ptp(self.scores) == 0)


def _precision_recall(scores: np.ndarray, is_member: np.ndarray, threshold: float) -> tuple[float, float]:
    predicted = scores >= threshold
    hits = int((predicted & is_member).sum())
    return (hits / int(predicted.sum()) if predicted.any() else float("nan")), hits / int(is_member.sum())


def salem_attack(
    shadow_logits: tuple[Tensor, Tensor],
    target_logits: tuple[Tensor, Tensor],
    thresholds: Sequence[float] = THRESHOLDS,
    seed: int = 0,
    **mlp_kwargs: float,
) -> SalemReport:
    """Attack the target's ``(in, out)`` logits with an MLP trained on the shadow model's ``(in, out)`` logits.

    ``k = min(3, classes)`` top probabilities (2 for binary data); ``mlp_kwargs`` go to :func:`train_attack_mlp`.
    """
    k = min(3, shadow_logits[0].shape[1])
    features = np.concatenate([top_k_features(logits, k) for logits in shadow_logits])
    labels = np.r_[np.ones(len(shadow_logits[0])), np.zeros(len(shadow_logits[1]))]
    attack = train_attack_mlp(features, labels, seed=seed, **mlp_kwargs)
    scores = np.concatenate([attack.member_probability(top_k_features(logits, k)) for logits in target_logits])
    is_member = np.r_[np.ones(len(target_logits[0]), bool), np.zeros(len(target_logits[1]), bool)]
    pairs = {t: _precision_recall(scores, is_member, t) for t in thresholds}
    return SalemReport(
        roc_metrics(scores, is_member),
        {t: p for t, (p, _) in pairs.items()},
        {t: r for t, (_, r) in pairs.items()},
        scores,
        is_member,
    )


def salem_audit(
    num_examples: int,
    train_fn: Callable[[np.ndarray], nn.Module],
    predict: Callable[[nn.Module, np.ndarray], Tensor],
    seed: int = 0,
    **kwargs: float,
) -> tuple[SalemReport, SalemSplit]:
    """The whole protocol on a training set of ``num_examples``: split, train shadow and target, attack.

    Args:
        num_examples: size of the training set the four quarters are cut from.
        train_fn: trains a fresh model (the recipe of the target) on the given indices.
        predict: the logits of a model on the given indices (noise on, one draw per example).
        seed: seed of the split and of the attack MLP.
        **kwargs: ``thresholds`` and :func:`train_attack_mlp` arguments.
    """
    split = salem_split(num_examples, seed)
    shadow, target = train_fn(split.shadow_in), train_fn(split.target_in)
    shadow_logits = (predict(shadow, split.shadow_in), predict(shadow, split.shadow_out))
    target_logits = (predict(target, split.target_in), predict(target, split.target_out))
    return salem_attack(shadow_logits, target_logits, seed=seed, **kwargs), split


def salem_checkpoint_audit(
    target: nn.Module,
    dataset: Dataset,
    members: np.ndarray,
    nonmembers: np.ndarray,
    train_fn: Callable[[np.ndarray], nn.Module],
    seed: int = 0,
    device: str | torch.device = "cpu",
    **kwargs: float,
) -> tuple[SalemReport, SalemSplit]:
    """The protocol on a ``target`` already trained on ``members`` of ``dataset`` (a checkpoint).

    ``D_target`` is ``n = min(#non-members, #members // 2)`` random members (``target_in``) and as many non-members
    (``target_out``), chosen by :func:`~lightning_dprobust.audit.membership.split_for_audit`; the remaining examples,
    none of them evaluated, are shuffled and halved into ``shadow_in`` and ``shadow_out``. One shadow model is
    trained by ``train_fn`` (the target's recipe) on ``shadow_in`` only; every model is queried once per example in
    eval mode, so a residual-perturbation network (and each member of an ensemble) keeps its noise on.

    Differences from :func:`salem_audit`: the target's training set is the checkpoint's (not a quarter of the data),
    so the shadow model's training set is as large as half of what is left, not as large as the target's.

    Args:
        target: the trained model (inputs to logits).
        dataset: every example: the members, the non-members and the data left for the shadow model.
        members: indices of the target's training examples; ``nonmembers``: indices it never saw.
        train_fn: trains a fresh model like the target on the given indices.
        seed: seed of the split, of the shadow halves and of the attack MLP.
        device: where the models run for inference.
        **kwargs: ``thresholds`` and :func:`train_attack_mlp` arguments.
    """
    evaluated = split_for_audit(members, nonmembers, seed)
    pool = np.random.default_rng(seed).permutation(evaluated.shadow_pool)
    half = len(pool) // 2
    if half < 1:
        raise ValueError(f"no data left for the shadow model: {len(members)} members and {len(nonmembers)} non-members")
    split = SalemSplit(np.sort(pool[:half]), np.sort(pool[half : 2 * half]), evaluated.members, evaluated.nonmembers)
    shadow = train_fn(split.shadow_in)

    def logits(model: nn.Module, indices: np.ndarray) -> Tensor:
        return model_outputs(model, Subset(dataset, indices.tolist()), device=device)[0]

    shadow_logits = (logits(shadow, split.shadow_in), logits(shadow, split.shadow_out))
    target_logits = (logits(target, split.target_in), logits(target, split.target_out))
    return salem_attack(shadow_logits, target_logits, seed=seed, **kwargs), split
