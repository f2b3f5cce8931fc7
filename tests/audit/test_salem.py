"""The residual-perturbation paper's membership audit (spec items 9 and 10)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sklearn.metrics import roc_auc_score
from torch.utils.data import TensorDataset

from lightning_dprobust.audit import AttackMLP, salem_attack, salem_audit, salem_checkpoint_audit, salem_split
from lightning_dprobust.audit.membership import top_k_features
from lightning_dprobust.audit.roc import roc_curve


@pytest.mark.parametrize(("size", "quarter"), [(50_000, 12_500), (39_952, 9_988), (1_293, 323)])
def test_split_sizes_exact_and_disjoint(size, quarter):
    split = salem_split(size, seed=1)
    parts = [split.shadow_in, split.shadow_out, split.target_in, split.target_out]
    assert [len(p) for p in parts] == [quarter] * 4
    assert len(np.unique(np.concatenate(parts))) == 4 * quarter


@pytest.mark.parametrize("classes", [10, 2])
def test_features_sorted_top_k_and_mlp_topology(classes):
    features = top_k_features(torch.randn(50, classes) * 3, k=3)
    assert features.shape == (50, min(3, classes))
    assert (features.sum(1) <= 1 + 1e-6).all() and (np.diff(features, axis=1) <= 0).all()
    sizes = [tuple(m.weight.shape) for m in AttackMLP(features.shape[1]).modules() if isinstance(m, torch.nn.Linear)]
    assert sizes == [(64, features.shape[1]), (2, 64)]


def test_constant_model_gives_chance_auc():
    constant = torch.tensor([[2.0, 1.0, 0.0, -1.0]]).repeat(400, 1)
    report = salem_attack((constant, constant), (constant, constant), lr=0.01)
    assert report.roc.auc == pytest.approx(0.5, abs=0.02) and report.collapsed


def _memorizing_logits(generator: torch.Generator, count: int, member: bool) -> torch.Tensor:
    """Logits of a model that memorised its (random-label) members: confident on them, unsure elsewhere."""
    scale = 8.0 if member else 1.0
    return scale * torch.randn(count, 10, generator=generator)


def test_memorizing_model_is_detected_and_metrics_match_direct_counts():
    g = torch.Generator().manual_seed(0)
    shadow = (_memorizing_logits(g, 300, True), _memorizing_logits(g, 300, False))
    target = (_memorizing_logits(g, 300, True), _memorizing_logits(g, 300, False))
    report = salem_attack(shadow, target, lr=0.01)
    assert report.roc.auc > 0.8 and not report.collapsed
    assert report.roc.auc == pytest.approx(roc_auc_score(report.is_member, report.scores))
    for threshold in (0.5, 0.6, 0.7, 0.8):
        predicted = report.scores >= threshold
        true_pos = np.sum(predicted & report.is_member)
        assert report.recall[threshold] == true_pos / 300
        assert report.precision[threshold] == true_pos / predicted.sum()


def test_roc_is_monotone_with_both_corners():
    scores = np.random.default_rng(0).random(200)
    fpr, tpr = roc_curve(scores, np.arange(200) < 100)
    assert (np.diff(fpr) >= 0).all() and (np.diff(tpr) >= 0).all()
    assert (fpr[0], tpr[0], fpr[-1], tpr[-1]) == (0.0, 0.0, 1.0, 1.0)


def test_audit_trains_shadow_and_target_on_their_in_halves_only():
    seen = []

    def train_fn(indices):
        seen.append(set(indices.tolist()))
        return torch.nn.Identity()

    logits = torch.randn(100, 10)
    report, split = salem_audit(100, train_fn, lambda _model, idx: logits[torch.as_tensor(idx)], epochs=2)
    assert seen == [set(split.shadow_in.tolist()), set(split.target_in.tolist())]
    assert len(report.scores) == 50


class _Lookup(torch.nn.Module):
    """A "model" of examples given by their index: confident (scale 8) logits on the indices it trained on."""

    def __init__(self, logits: torch.Tensor, trained_on: np.ndarray) -> None:
        super().__init__()
        scale = torch.ones(len(logits), 1)
        scale[torch.as_tensor(trained_on)] = 8.0
        self.table = logits * scale

    def forward(self, index: torch.Tensor) -> torch.Tensor:
        return self.table[index.long().squeeze(1)]


def test_checkpoint_audit_trains_one_shadow_on_data_disjoint_from_the_evaluated_target():
    logits = torch.randn(420, 10, generator=torch.Generator().manual_seed(0))
    dataset = TensorDataset(torch.arange(420.0).unsqueeze(1), torch.zeros(420, dtype=torch.long))
    members, nonmembers = np.arange(300), np.arange(300, 420)
    target = _Lookup(logits, members)
    shadows = []

    def train_fn(indices):
        shadows.append(_Lookup(logits, indices))
        return shadows[-1]

    report, split = salem_checkpoint_audit(target, dataset, members, nonmembers, train_fn, seed=3, lr=0.01)
    parts = [split.shadow_in, split.shadow_out, split.target_in, split.target_out]
    assert [len(p) for p in parts] == [90, 90, 120, 120]
    assert len(np.unique(np.concatenate(parts))) == 420
    assert set(split.target_in) <= set(members) and set(split.target_out) <= set(nonmembers)
    assert len(shadows) == 1 and torch.equal(shadows[0].table, _Lookup(logits, split.shadow_in).table)
    direct = salem_attack(
        (shadows[0].table[split.shadow_in], shadows[0].table[split.shadow_out]),
        (target.table[split.target_in], target.table[split.target_out]),
        seed=3,
        lr=0.01,
    )
    assert np.array_equal(report.scores, direct.scores) and report.roc.auc == direct.roc.auc > 0.8
