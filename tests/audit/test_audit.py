"""Privacy audit: ROC metrics, the one-run epsilon bound, the membership attacks and ``dprobust audit`` on digits."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from sklearn.metrics import roc_auc_score
from sklearn.metrics import roc_curve as sklearn_roc_curve
from torch.utils.data import ConcatDataset, Subset

from lightning_dprobust.audit.canaries import (
    audit_guesses,
    choose_canaries,
    epsilon_lower_bound,
    guess_membership,
    one_run_p_value,
)
from lightning_dprobust.audit.membership import (
    ShadowModels,
    lira_offline_scores,
    logit_confidence,
    loss_scores,
    membership_audit,
    model_outputs,
    split_for_audit,
)
from lightning_dprobust.audit.roc import roc_auc, roc_curve, roc_metrics, tpr_at_fpr
from lightning_dprobust.audit.runner import RecipeTrainer, audit_splits, canary_audit, train_classifier
from lightning_dprobust.cli import main
from lightning_dprobust.cli.audit import audit_command
from lightning_dprobust.cli.main import command
from lightning_dprobust.methods import DPSGD
from lightning_dprobust.recipes import load_recipe
from tests.helpers import digits, quiet_trainer, read_wandb_history, wandb_run_file

CONFIG = str(Path(__file__).resolve().parents[2] / "configs" / "dpsgd" / "digits.yaml")


# ------------------------------------------------------------------------------------------------------------ ROC
def test_auc_and_roc_points_match_sklearn_on_scores_with_ties():
    rng = np.random.default_rng(0)
    for _ in range(5):
        labels = rng.random(300) < 0.4
        scores = rng.integers(0, 15, 300) + 3.0 * labels  # many ties, shifted for members
        assert roc_auc(scores, labels) == pytest.approx(roc_auc_score(labels, scores), abs=1e-12)
        fpr, tpr = roc_curve(scores, labels)
        expected_fpr, expected_tpr, _ = sklearn_roc_curve(labels, scores, drop_intermediate=False)
        np.testing.assert_allclose(fpr, expected_fpr)
        np.testing.assert_allclose(tpr, expected_tpr)


def test_tpr_at_fpr_interpolates_along_the_curve_by_hand():
    # members score 2 and 1, non-members 1 and 0: ROC points (0, 0), (0, 1/2), (1/2, 1), (1, 1)
    fpr, tpr = roc_curve(np.array([2.0, 1.0, 1.0, 0.0]), np.array([1, 1, 0, 0]))
    np.testing.assert_allclose(fpr, [0, 0, 0.5, 1])
    np.testing.assert_allclose(tpr, [0, 0.5, 1, 1])
    assert tpr_at_fpr(fpr, tpr, 0.0) == 0.5  # vertical segment: the highest TPR at that FPR
    assert tpr_at_fpr(fpr, tpr, 0.25) == pytest.approx(0.75)  # halfway along the diagonal tie segment
    assert tpr_at_fpr(fpr, tpr, 0.5) == 1.0


def test_balanced_accuracy_is_the_best_over_all_thresholds():
    rng = np.random.default_rng(1)
    labels = rng.random(200) < 0.5
    scores = rng.normal(size=200) + labels
    brute = max(((scores[labels] >= t).mean() + (scores[~labels] < t).mean()) / 2 for t in np.r_[scores, np.inf])
    assert roc_metrics(scores, labels).balanced_accuracy == pytest.approx(brute)


def test_separated_scores_give_perfect_metrics_and_chance_scores_do_not():
    labels = np.r_[np.ones(500, bool), np.zeros(2000, bool)]
    perfect = roc_metrics(np.r_[np.arange(500) + 2000.0, np.arange(2000.0)], labels)
    assert (perfect.auc, perfect.balanced_accuracy, perfect.tpr_at_low_fpr[0.001]) == (1.0, 1.0, 1.0)
    constant = roc_metrics(np.zeros(2500), labels)
    assert constant.auc == 0.5
    assert constant.tpr_at_low_fpr[0.01] == pytest.approx(0.01)  # the single diagonal segment


@pytest.mark.parametrize(
    ("scores", "labels", "match"),
    [([1.0, 2.0], [1, 1], "one member and one non-member"), ([np.nan, 1.0], [1, 0], "NaN"), ([1.0], [1, 0], "1-d")],
)
def test_roc_refuses_unusable_inputs(scores, labels, match):
    with pytest.raises(ValueError, match=match):
        roc_metrics(np.array(scores), np.array(labels))


# ---------------------------------------------------------------------------------------------- one-run bound
@pytest.mark.parametrize("r", [5, 10, 50, 200])
def test_all_correct_guesses_give_the_closed_form_pure_dp_bound(r):
    q = 0.05 ** (1 / r)  # P[Binomial(r, q) >= r] = q^r = beta
    assert epsilon_lower_bound(m=r, r=r, v=r, beta=0.05) == pytest.approx(math.log(q / (1 - q)), abs=1e-5)


@pytest.mark.parametrize("r", [10, 100, 1000])
def test_half_correct_guesses_give_no_bound(r):
    assert epsilon_lower_bound(m=r, r=r, v=r // 2, beta=0.05, delta=1e-5) == 0.0


def test_bound_increases_with_the_number_of_correct_guesses():
    bounds = [epsilon_lower_bound(m=200, r=100, v=v, beta=0.05, delta=1e-5) for v in range(50, 101)]
    assert all(b <= c for b, c in zip(bounds, bounds[1:], strict=False))
    assert bounds[0] == 0.0 < bounds[-10] < bounds[-1]


def test_p_value_with_delta_matches_a_direct_binomial_sum():
    m, r, v, epsilon, delta = 40, 20, 16, 0.7, 1e-3
    q = math.exp(epsilon) / (1 + math.exp(epsilon))
    pmf = [math.comb(r, j) * q**j * (1 - q) ** (r - j) for j in range(r + 1)]
    tail = sum(pmf[v:])
    alpha = max(sum(pmf[v - i : v]) / i for i in range(1, v + 1))
    assert one_run_p_value(m, r, v, epsilon, delta) == pytest.approx(tail + 2 * m * delta * alpha, rel=1e-9)
    assert one_run_p_value(m, r, v, epsilon, 0.0) == pytest.approx(tail, rel=1e-9)


def test_delta_only_lowers_the_bound():
    pure = epsilon_lower_bound(m=500, r=300, v=250, beta=0.05)
    approximate = epsilon_lower_bound(m=500, r=300, v=250, beta=0.05, delta=1e-4)
    assert 0 < approximate < pure
    assert one_run_p_value(500, 300, 250, approximate, 1e-4) == pytest.approx(0.05, abs=1e-4)


def test_bound_is_valid_and_nearly_tight_for_randomized_response():
    """Each guess of epsilon-DP randomized response is right with probability e^eps / (1 + e^eps): the bound must
    exceed the true epsilon in at most beta of the runs, and should come close to it."""
    epsilon, m, runs = 1.0, 1000, 300
    correct = np.random.default_rng(0).binomial(m, math.exp(epsilon) / (1 + math.exp(epsilon)), size=runs)
    bounds = np.array([epsilon_lower_bound(m, m, int(v), beta=0.05) for v in correct])
    assert (bounds > epsilon).mean() <= 0.05 + 0.03  # beta plus three binomial standard errors of 300 runs
    assert np.median(bounds) > 0.75


def test_guesses_take_the_top_and_bottom_scores_and_the_union_bound_divides_beta():
    scores = np.array([0.9, 0.1, 0.5, 0.8, 0.2, 0.3])
    np.testing.assert_array_equal(guess_membership(scores, 2, 1), [1, -1, 0, 1, 0, 0])
    included = np.r_[np.ones(20, bool), np.zeros(20, bool)]
    audit = audit_guesses(np.r_[np.ones(20), np.zeros(20)] + np.arange(40) * 1e-3, included, [(5, 5), (20, 20)])
    assert (audit.k_plus, audit.correct, audit.num_candidates) == (20, 40, 2)
    assert audit.epsilon_lower_bound == pytest.approx(epsilon_lower_bound(40, 40, 40, beta=0.025))


def test_canaries_are_distinct_mislabeled_and_half_included():
    labels = np.random.default_rng(0).integers(0, 10, 500)
    chosen, canary_labels, included = choose_canaries(500, 400, 10, labels, seed=3)
    assert len(np.unique(chosen)) == 400
    assert (canary_labels != labels[chosen]).all() and set(canary_labels) <= set(range(10))
    assert 160 < included.sum() < 240
    again = choose_canaries(500, 400, 10, labels, seed=3)
    np.testing.assert_array_equal(again[2], included)
    with pytest.raises(ValueError, match="held-out pool"):
        choose_canaries(500, 501, 10, labels, seed=3)


# ----------------------------------------------------------------------------------------- attacks, synthetic
def test_logit_confidence_is_the_log_odds_of_the_true_class():
    logits = torch.randn(50, 10, dtype=torch.float64) * 3
    labels = torch.randint(0, 10, (50,))
    p = torch.softmax(logits, dim=1)[torch.arange(50), labels]
    torch.testing.assert_close(logit_confidence(logits, labels), torch.log(p / (1 - p)))


def _two_class_logits(phi: np.ndarray) -> torch.Tensor:
    """Logits ``[phi, 0]`` of two classes: the log odds of class 0 is exactly ``phi``."""
    phi = torch.as_tensor(phi, dtype=torch.float64)
    return torch.stack([phi, torch.zeros_like(phi)], dim=-1)


def test_offline_lira_is_the_z_score_under_the_out_gaussian():
    phi_out = np.array([[0.0, 1.0], [2.0, 1.5], [4.0, 2.0]])  # 3 OUT models x 2 targets
    shadows = ShadowModels(_two_class_logits(phi_out), np.zeros((3, 2), bool))
    labels, observed = torch.zeros(2, dtype=torch.long), np.array([5.0, 1.0])
    per_example = lira_offline_scores(shadows, np.arange(2), labels, _two_class_logits(observed), False)
    np.testing.assert_allclose(per_example, [(5 - 2) / 2, (1 - 1.5) / 0.5])  # sample stds 2 and 0.5
    pooled = lira_offline_scores(shadows, np.arange(2), labels, _two_class_logits(observed), True)
    np.testing.assert_allclose(pooled, [(5 - 2) / math.sqrt(2.125), (1 - 1.5) / math.sqrt(2.125)])
    with pytest.raises(ValueError, match="OUT models"):
        lira_offline_scores(ShadowModels(shadows.logits, np.eye(3, 2, dtype=bool)), np.arange(2), labels, None)


def test_audit_split_is_balanced_and_keeps_evaluated_examples_out_of_the_shadow_pool():
    split = split_for_audit(np.arange(100), np.arange(100, 130), seed=0)
    assert len(split.members) == len(split.nonmembers) == 30
    assert set(split.members) <= set(range(100)) and set(split.nonmembers) == set(range(100, 130))
    assert not set(split.shadow_pool) & set(split.targets)
    assert len(split.shadow_pool) == 70


# ---------------------------------------------------------------------------------------------------- digits
@pytest.fixture(scope="module")
def recipe_and_data():
    return load_recipe(CONFIG)


@pytest.fixture(scope="module")
def small_member_split(recipe_and_data):
    """100 random digits train examples are members; the 504 validation + test images are non-members."""
    _, datamodule = recipe_and_data
    train, held_out = audit_splits(datamodule)
    dataset = ConcatDataset([train, *held_out])
    members = np.sort(np.random.default_rng(0).permutation(len(train))[:100])
    return dataset, members, np.arange(len(train), len(dataset))


@pytest.fixture(scope="module")
def overfit_recipe(recipe_and_data):
    return recipe_and_data[0].replace(dp=None, max_epochs=100, batch_size=64)


def test_canary_audit_bounds_dp_below_one_and_non_private_training_clearly_above(recipe_and_data):
    recipe, datamodule = recipe_and_data
    private = canary_audit(recipe.replace(dp=recipe.dp | {"target_epsilon": 1.0}), datamodule, num_canaries=200)
    exposed = canary_audit(recipe.replace(dp=None, max_epochs=100), datamodule, num_canaries=200)
    assert private.claimed_epsilon <= 1.0 and private.claimed_delta == 1e-5
    assert private.audit.epsilon_lower_bound < 1.0
    assert math.isinf(exposed.claimed_epsilon)
    assert exposed.audit.epsilon_lower_bound > 2.0
    assert exposed.audit.epsilon_lower_bound > private.audit.epsilon_lower_bound + 1.0


def test_dp_model_leaks_less_membership_than_an_overfit_model_on_the_same_split(
    recipe_and_data, small_member_split, overfit_recipe
):
    recipe, datamodule = recipe_and_data
    dataset, members, nonmembers = small_member_split
    is_member = np.r_[np.ones(len(members), bool), np.zeros(len(nonmembers), bool)]
    aucs = {}
    for name, chosen in {"dp": recipe.replace(dp=recipe.dp | {"target_epsilon": 1.0}, batch_size=64),
                         "overfit": overfit_recipe}.items():  # fmt: skip
        model = train_classifier(chosen, Subset(dataset, members.tolist())).module
        logits, labels = model_outputs(model, dataset)
        order = np.r_[members, nonmembers]
        aucs[name] = roc_auc_score(is_member, loss_scores(logits[order], labels[order]))
    assert aucs["overfit"] > 0.65
    assert aucs["dp"] < aucs["overfit"] - 0.08


def test_shadow_and_lira_attacks_detect_an_overfit_model(recipe_and_data, small_member_split, overfit_recipe):
    _, datamodule = recipe_and_data
    dataset, members, nonmembers = small_member_split
    target = train_classifier(overfit_recipe, Subset(dataset, members.tolist())).module
    shadows = RecipeTrainer(overfit_recipe.replace(max_epochs=60), dataset)
    report = membership_audit(target, dataset, members, nonmembers, shadows, num_shadows=3, shadow_size=100)
    assert shadows.calls == 3 and report.num_shadows == 3
    assert len(report.split.members) == len(report.split.nonmembers) == 50
    for name in ("loss", "shadow", "lira"):
        assert report.metrics[name].auc > 0.6, name


# ------------------------------------------------------------------------------------------------------- CLI
def test_audit_is_a_dprobust_subcommand():
    assert command("audit") is audit_command


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    """DPSGD mlp_tanh trained without DP for 3 epochs on the digits train split (seed 0), saved by a Trainer."""
    root = tmp_path_factory.mktemp("fit")
    torch.manual_seed(0)
    data = digits(batch_size=64)
    module = DPSGD(model="mlp_tanh", num_classes=10, input_shape=(1, 8, 8), mean=data.mean, std=data.std, lr=0.05)
    trainer = quiet_trainer(root, max_epochs=3)
    trainer.fit(module, data)
    trainer.save_checkpoint(root / "mlp.ckpt")
    return root / "mlp.ckpt"


def test_cli_canary_audit_prints_the_claimed_epsilon_and_the_bound(tmp_path, capsys):
    argv = ["audit", "--config", CONFIG, "--canaries", "20", "--epochs", "2", "--out", str(tmp_path), "--no-wandb"]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "claimed epsilon: 2.9" in printed or "claimed epsilon: 3.0" in printed
    assert "empirical lower bound: 0.000" in printed
    assert "epsilon lower bound" in (tmp_path / "audit.md").read_text()


def test_cli_membership_audit_logs_the_loss_auc_it_prints(checkpoint, tmp_path, capsys):
    assert main(["audit", "--ckpt_path", str(checkpoint), "--attack", "loss", "--out", str(tmp_path)]) == 0
    data = digits()
    data.setup()
    run_file = wandb_run_file(tmp_path)
    logged = {key: value for row in read_wandb_history(run_file) for key, value in row.items()}
    split = split_for_audit(np.arange(1293), np.arange(1293, 1797), seed=0)
    images = torch.cat([data.train_set.tensors[0], data.val_set.tensors[0], data.test_set.tensors[0]])
    labels = torch.cat([data.train_set.tensors[1], data.val_set.tensors[1], data.test_set.tensors[1]])
    model = torch.load(checkpoint, weights_only=True)
    module = DPSGD(**model["hyper_parameters"])
    module.load_state_dict(model["state_dict"])
    with torch.no_grad():
        losses = F.cross_entropy(module(images[split.targets]), labels[split.targets], reduction="none")
    expected = roc_auc_score(split.is_member, -losses.numpy())
    assert logged["membership/loss/auc"] == pytest.approx(expected, abs=1e-6)
    assert f"| loss | {expected:.4f} |" in capsys.readouterr().out
    assert (tmp_path / "roc.png").stat().st_size > 0


def test_cli_membership_audit_trains_shadows_from_the_checkpoint_hyperparameters(checkpoint, tmp_path, capsys):
    argv = ["audit", "--ckpt_path", str(checkpoint), "--shadows", "2", "--epochs", "1", "--out", str(tmp_path)]
    assert main([*argv, "--no-wandb"]) == 0
    printed = capsys.readouterr().out
    assert all(f"| {name} |" in printed for name in ("loss", "shadow", "lira"))
    assert "2 shadow models on a pool of 789" in printed


@pytest.mark.parametrize(
    "flags",
    [
        [],
        ["--canaries", "10"],
        ["--config", CONFIG, "--canaries", "1"],
        ["--config", CONFIG, "--canaries", "10", "--beta", "1.5"],
        ["--config", "missing.yaml", "--canaries", "10"],
        ["--ckpt_path", "CKPT", "--config", CONFIG, "--canaries", "10"],
        ["--ckpt_path", "CKPT", "--shadows", "1"],
        ["--ckpt_path", "CKPT", "--attack", "bogus"],
        ["--ckpt_path", "missing.ckpt"],
        ["--ckpt_path", "CKPT", "--bogus-flag"],
    ],
)
def test_cli_bad_flags_exit_2_with_a_one_line_message(flags, checkpoint, tmp_path, capsys):
    flags = [str(checkpoint) if flag == "CKPT" else flag for flag in flags]
    assert main(["audit", *flags, "--out", str(tmp_path), "--no-wandb"]) == 2
    assert capsys.readouterr().err.startswith("dprobust: error:")
