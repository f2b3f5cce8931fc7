"""StoBatch's per-example terms and its nominal epsilon: with the default network (``normalization="none"``) one
example's logits, last hidden layer and loss term depend on that example alone (Lemma 4's premise), which the paper's
batch normalization breaks. Theorem 4 does not follow from what the code does with either network, so the epsilon is
recorded in the ledger, logged (W&B included), printed and catalogued in the zoo as nominal, never as a guarantee."""

from __future__ import annotations

import math

import pytest
import torch

from lightning_dprobust.callbacks.run import LedgerLogger, fit_summary
from lightning_dprobust.cli.zoo import table_rows
from lightning_dprobust.core import stobatch as sb
from lightning_dprobust.methods import StoBatch
from lightning_dprobust.methods import stobatch as method
from lightning_dprobust.models.stobatch import StoBatchNet
from lightning_dprobust.zoo.build import module_privacy_record
from lightning_dprobust.zoo.hub import Zoo
from tests.helpers import digits, quiet_trainer

M = 120


def module(normalization: str = "none", **kwargs) -> StoBatch:
    defaults = dict(batch_size=M, attack_steps=1, num_classes=10, input_shape=(1, 8, 8))
    return StoBatch(model_kwargs={"normalization": normalization}, **(defaults | kwargs))


def batch_and_neighbour(changed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A ``2m`` digits batch, its labels, and the same batch with example ``changed`` replaced."""
    data = digits()
    data.setup("fit")
    x, y = data.train_set.tensors[0][: 2 * M], data.train_set.tensors[1][: 2 * M]
    neighbour = x.clone()
    neighbour[changed] = data.train_set.tensors[0][2 * M]
    return x, y, neighbour


def example_terms(sto: StoBatch, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Training-mode logits and last hidden layer of each example of ``x`` (what the loss reads)."""
    net = sto.net.train()
    features = net.features(net.perturb(x))
    return net.classify(features), net.last_hidden(features)


@pytest.mark.parametrize("normalization", ["none", "batch"])
@torch.no_grad()
def test_one_example_moves_no_other_example_only_without_batch_normalization(normalization):
    sto = module(normalization)
    sto.draw_noise(torch.Generator().manual_seed(0))
    x, _, neighbour = batch_and_neighbour(changed=3)
    others = torch.arange(2 * M) != 3
    logits, last = example_terms(sto, x)
    logits_n, last_n = example_terms(sto, neighbour)
    assert not torch.equal(logits[3], logits_n[3])
    unchanged = torch.equal(logits[others], logits_n[others]) and torch.equal(last[others], last_n[others])
    assert unchanged == (normalization == "none")  # batch statistics couple the examples


def test_the_classification_loss_changes_by_the_changed_example_s_own_term_alone():
    """Lemma 4's premise on the loss itself: replacing benign example ``j`` changes ``L_bar`` by ``j``'s own Taylor
    term (the adversarial half, crafted with the same randomness, is unchanged)."""
    sto = module()
    sto.draw_noise(torch.Generator().manual_seed(0))
    sto.double()  # the loss sums 2m terms: float64 keeps one term's change above rounding
    x, y, neighbour = (t.double() if t.is_floating_point() else t for t in batch_and_neighbour(changed=5))
    _, loss = sto.stobatch_losses(x, y, 0.3, torch.Generator().manual_seed(1))
    _, loss_n = sto.stobatch_losses(neighbour, y, 0.3, torch.Generator().manual_seed(1))
    target = torch.nn.functional.one_hot(y[5:6], 10).double()
    own = [sb.taylor_cross_entropy(example_terms(sto, z[5:6])[0], target) for z in (x, neighbour)]
    expected = (own[1] - own[0]) / (M * (1 + sto.hparams.xi))
    assert (loss_n - loss).item() == pytest.approx(expected.item(), rel=1e-9, abs=1e-12)


@torch.no_grad()
def test_released_per_example_network_classifies_one_example_at_a_time():
    net = StoBatchNet(num_classes=10, input_shape=(1, 8, 8)).eval()
    x = torch.rand(6, 1, 8, 8)
    alone = torch.cat([net(x[i : i + 1]) for i in range(len(x))])
    assert torch.allclose(net(x), alone, atol=1e-6)
    assert not any(isinstance(layer, torch.nn.BatchNorm1d) for layer in net.modules())


def fit_one_step(tmp_path, normalization: str) -> tuple[StoBatch, object]:
    sto = module(normalization, epsilon=2.0)
    trainer = quiet_trainer(tmp_path, max_epochs=1, limit_train_batches=1)
    trainer.fit(sto, digits())
    return sto, trainer


@pytest.mark.parametrize("normalization", ["none", "batch"])
def test_every_fit_records_releases_and_reports_a_nominal_claim_never_a_guarantee(tmp_path, normalization):
    with pytest.warns(UserWarning, match="NOT a differential-privacy guarantee") as warned:
        sto, trainer = fit_one_step(tmp_path, normalization)
    batch_caveat = any("normalization='batch'" in str(warning.message) for warning in warned)
    assert batch_caveat == (normalization == "batch")
    assert sto.ledger.laplace == () and math.isinf(sto.ledger.epsilon(0.0))
    assert [claim.source for claim in sto.ledger.nominal] == [method.NOMINAL_SOURCE]
    assert sto.ledger.nominal_summary().startswith("no DP guarantee; nominal epsilon 2 at delta 0")
    summary = fit_summary(trainer, None)
    assert "no DP guarantee; nominal epsilon 2" in summary and "pure DP" not in summary
    record = module_privacy_record(trainer)  # what a zoo build releases as meta.privacy
    assert record["accountant"] == "nominal" and record["epsilon"] == 2.0 and record["delta"] == 0.0
    metrics = trainer.callback_metrics
    assert float(metrics["privacy/nominal_epsilon"]) == 2.0 and "privacy/epsilon" not in metrics


def test_the_wandb_run_logs_the_epsilon_as_nominal_only(tmp_path):
    from lightning.pytorch.loggers import WandbLogger

    from tests.helpers import read_wandb_history, wandb_run_file

    logger = WandbLogger(save_dir=tmp_path, offline=True, log_model=False)
    trainer = quiet_trainer(tmp_path, max_epochs=1, limit_train_batches=1, logger=logger, callbacks=[LedgerLogger()])
    with pytest.warns(UserWarning, match="NOT a differential-privacy guarantee"):
        trainer.fit(module(epsilon=2.0), digits())
    logger.experiment.finish()
    history = read_wandb_history(wandb_run_file(tmp_path))
    assert [row["privacy/nominal_epsilon"] for row in history if "privacy/nominal_epsilon" in row] == [2.0]
    assert not any("privacy/epsilon" in row for row in history)


def test_every_stobatch_zoo_entry_says_nominal():
    entries = Zoo().list_entries("stobatch_cnn.*")
    assert len(entries) >= 7
    for entry, row in zip(entries, table_rows(entries), strict=True):
        privacy = entry.meta["privacy"]
        assert privacy["accountant"] == "nominal" and privacy["delta"] == 0, entry.name
        assert "nominal" in entry.meta["notes"] and "no differential-privacy guarantee" in entry.meta["notes"]
        assert row[3] == f"{privacy['epsilon']:.3f} nominal (no DP guarantee)", entry.name


def test_bad_normalization_and_gain_are_refused_in_one_line():
    for kwargs, message in (({"normalization": "layer"}, "normalization="), ({"feature_gain": 0}, "feature_gain=")):
        with pytest.raises(ValueError, match=message) as error:
            StoBatchNet(num_classes=10, input_shape=(1, 8, 8), **kwargs)
        assert "\n" not in str(error.value)


def test_a_fit_at_chance_says_what_to_raise(tmp_path):
    sto = StoBatch(
        batch_size=M, attack_steps=1, num_classes=10, input_shape=(1, 8, 8), model_kwargs={"feature_gain": 1e-9}
    )
    trainer = quiet_trainer(tmp_path, max_epochs=1, limit_train_batches=1, limit_val_batches=None)
    with pytest.warns(UserWarning, match="at chance: raise model_kwargs.feature_gain"):
        trainer.fit(sto, digits())
