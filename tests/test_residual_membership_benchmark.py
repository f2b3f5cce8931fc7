"""benchmarks/residual_membership.py: sample-std cells, the convergence stop, result files built from saved runs."""

from __future__ import annotations

import json
import statistics
import sys
from types import SimpleNamespace

import pytest
import torch

from tests.helpers import load_benchmark

bench = load_benchmark("residual_membership")
convergence = sys.modules["convergence"]


def _record(seed: int, acc: float, epochs: int = 12) -> dict:
    return dict(seed=seed, train_acc=acc + 0.01, test_acc=acc, gap=0.01, epoch_s=1.0, epochs=epochs, val_history=[])


def _metrics(acc: float) -> dict:
    return dict(auc_loss=0.5 + acc / 10, auc_shadow=0.5, auc_lira=0.5, epsilon=float("inf"))


def test_cells_are_sample_stds_and_name_the_epochs_and_seeds():
    row = bench._rows()[0]
    accuracies = [0.90, 0.95, 0.97]
    row.results.extend(_record(seed, acc, 10 + seed) | _metrics(acc) for seed, acc in enumerate(accuracies))
    (cells,) = bench._table_cells([row])
    header = bench.TABLE_HEADER
    assert cells[header.index("test acc")] == f"{statistics.mean(accuracies):.3f} +- {statistics.stdev(accuracies):.3f}"
    assert cells[header.index("epochs")] == "11.0 +- 1.0"
    assert cells[header.index("seeds")] == "0-2"
    assert cells[header.index("epsilon")] == "none (not private)"


@pytest.mark.parametrize(
    ("seeds", "text"), [([2, 0, 1, 3], "0-3"), ([0, 2, 5], "0, 2, 5"), ([4], "4"), ([0, 1], "0, 1")]
)
def test_seed_lists(seeds, text):
    assert bench._seed_list(seeds) == text


class _Net(torch.nn.Module):
    """Predicts class 0 for every image; the monitored split's labels decide the accuracy. Its one weight holds the
    number of the epoch that last wrote it (the helper below writes it before each epoch end)."""

    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(()))

    def forward(self, x):
        return torch.zeros(len(x), 2).index_fill_(1, torch.tensor([0]), 1.0)


def _epochs_until_stop(monkeypatch, accuracies: list[float], **kwargs) -> tuple[int, list[float]]:
    """Run the callback's epoch-end hook on a validation split whose accuracy follows ``accuracies``."""
    module = _train(monkeypatch, accuracies, **kwargs)
    return module.converged_epochs, module.val_history


def _train(monkeypatch, accuracies: list[float], **kwargs) -> _Net:
    """Epochs whose validation accuracy follows ``accuracies``, each ending with the module's weight set to its number
    (from 1), then the end of training; the module it leaves."""
    splits = iter(accuracies)

    def split(*_):
        correct = round(next(splits) * 1000)
        labels = torch.tensor([0] * correct + [1] * (1000 - correct))
        return torch.utils.data.TensorDataset(torch.zeros(1000, 1), labels)

    monkeypatch.setattr(convergence, "_validation_split", split)
    callback, module = convergence.Convergence(**kwargs), _Net()
    trainer = SimpleNamespace(current_epoch=0, should_stop=False)
    while not trainer.should_stop:
        with torch.no_grad():
            module.weight.fill_(trainer.current_epoch + 1)
        callback.on_train_epoch_end(trainer, module)
        trainer.current_epoch += 1
    callback.on_train_end(trainer, module)
    return module


def test_training_stops_after_patience_epochs_without_an_improvement_above_min_delta(monkeypatch):
    # 0.701 improves on 0.700 by 0.1 points, less than min_delta: it does not count, so epoch 5 is the third in a row
    epochs, history = _epochs_until_stop(monkeypatch, [0.5, 0.7, 0.701, 0.699, 0.69, 0.9], patience=3, min_delta=0.002)
    assert epochs == 5 and history == pytest.approx([0.5, 0.7, 0.701, 0.699, 0.69])
    epochs, _ = _epochs_until_stop(monkeypatch, [0.5, 0.7, 0.701, 0.71, 0.70, 0.70, 0.70], patience=3, min_delta=0.002)
    assert epochs == 7  # 0.71 is an improvement of 0.9 points: the count restarts there


def test_training_never_stops_before_min_epochs(monkeypatch):
    flat = [0.1] * 12  # no improvement after the first epoch: patience 3 alone would stop at epoch 4
    assert _epochs_until_stop(monkeypatch, flat, patience=3, min_delta=0.002)[0] == 4
    assert _epochs_until_stop(monkeypatch, flat, patience=3, min_delta=0.002, min_epochs=10)[0] == 10
    # patience already spent when min_epochs is reached: it stops right there; still improving then: it goes on
    assert _epochs_until_stop(monkeypatch, [0.5] * 6, patience=3, min_delta=0.002, min_epochs=5)[0] == 5
    rising = [0.1 * epoch for epoch in range(1, 8)]
    assert _epochs_until_stop(monkeypatch, [*rising, 0.7, 0.7, 0.7], patience=3, min_epochs=5)[0] == 10


def test_the_weights_of_the_best_validation_epoch_are_restored(monkeypatch):
    # best at epoch 3 (0.9); 0.9 is not beaten later, so training stops at epoch 6 and the module gets epoch 3's weight
    module = _train(monkeypatch, [0.5, 0.8, 0.9, 0.85, 0.9, 0.7], patience=3, min_delta=0.002)
    assert module.converged_epochs == 6 and module.best_epoch == 3
    assert float(module.weight.detach()) == 3.0
    # the best epoch counts any gain, even one below min_delta (which only decides when to stop)
    module = _train(monkeypatch, [0.5, 0.7, 0.701, 0.6, 0.6, 0.6], patience=3, min_delta=0.002, min_epochs=6)
    assert module.converged_epochs == 6 and module.best_epoch == 3 and float(module.weight.detach()) == 3.0


def test_a_fixed_epoch_count_ignores_the_accuracy_and_keeps_the_last_weights(monkeypatch):
    module = _train(monkeypatch, [], epochs=4)
    assert module.converged_epochs == 4 and module.val_history == []
    assert module.best_epoch == 4 and float(module.weight.detach()) == 4.0


def test_shadow_models_train_as_many_epochs_as_the_targets_best_epoch(monkeypatch):
    target = _Net()
    target.converged_epochs, target.best_epoch, target.val_history = 14, 11, [0.5]
    target.ledger = SimpleNamespace(nominal=[SimpleNamespace(epsilon=float("inf"))])
    recipes = []
    monkeypatch.setattr(bench, "train_classifier", lambda recipe, _: SimpleNamespace(module=target))
    monkeypatch.setattr(bench, "_accuracy", lambda *_: 0.5)

    def audit(model, datamodule, recipe, *_):
        recipes.append(recipe)
        return SimpleNamespace(metrics={"loss": SimpleNamespace(auc=0.5)})

    monkeypatch.setattr(bench, "checkpoint_membership_audit", audit)
    result = bench._run(bench._rows()[0], "digits", 0, 30, 2, patience=3, min_delta=0.002, min_epochs=10)
    assert result["epochs"] == 14 and result["best_epoch"] == 11
    (callback,) = recipes[0].config["trainer"]["callbacks"]
    assert callback["init_args"]["epochs"] == 11 and recipes[0].config["trainer"]["max_epochs"] == 30


def test_a_converging_recipe_gives_the_callback_the_datasets_validation_split():
    recipe = bench._recipe(bench._rows()[0], "mnist5k", 3, 30, {"patience": 3, "min_delta": 0.002, "min_epochs": 10})
    (callback,) = recipe.config["trainer"]["callbacks"]
    assert callback["class_path"] == "convergence.Convergence"
    assert callback["init_args"] == {
        "data_module": "MNIST5kDataModule",
        "data_args": {"test_fraction": 0.5},
        "patience": 3,
        "min_delta": 0.002,
        "min_epochs": 10,
    }
    assert recipe.config["trainer"]["max_epochs"] == 30
    assert "callbacks" not in bench._recipe(bench._rows()[0], "mnist5k", 3, 30).config["trainer"]


def test_saved_runs_are_tabulated_into_result_files(tmp_path, monkeypatch, capsys):
    row = bench._rows()[1].name
    log = tmp_path / "runs.log"
    log.write_text(
        "".join(json.dumps({"row": row} | _record(s, a) | _metrics(a)) + "\n" for s, a in [(1, 0.8), (0, 0.9)])
    )
    argv = ["residual_membership.py", "--dataset", "mnist5k", "--rows", row, "--collect", str(log)]
    argv += ["--patience", "3", "--epochs", "30", "--results-dir", str(tmp_path), "--out", str(tmp_path / "out.md")]
    monkeypatch.setattr(sys, "argv", argv)
    bench.main()
    record = json.loads((tmp_path / "residual_membership_mnist5k.json").read_text())
    assert record["columns"] == bench.TABLE_HEADER and record["seeds"] == [0, 1]
    (cells,) = record["rows"]
    assert cells[:2] == [row, f"0.850 +- {statistics.stdev([0.8, 0.9]):.3f}"]
    assert "until converged" in record["notes"] and "3 epochs" in record["notes"]
    assert (tmp_path / "residual_membership_mnist5k_timing.json").exists()
    assert "| RP-I En1 gamma 0.25 | 0.850 +- 0.071 |" in capsys.readouterr().out
