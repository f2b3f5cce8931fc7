"""The seed-sweep helper of the benchmarks: seeds reach the model and the DP callback, spreads are sample stds."""

from __future__ import annotations

import re
import statistics
from pathlib import Path

import pytest
import torch
import yaml

from lightning_dprobust.recipes import CONFIG_DIR, build_recipe, find_dp_callback
from tests.helpers import load_benchmark

seeds = load_benchmark("seeds")
Sweep, seeded_config, sweep = seeds.Sweep, seeds.seeded_config, seeds.sweep

DPSGD_DIGITS = CONFIG_DIR / "dpsgd" / "digits.yaml"


def test_seeded_config_sets_the_global_and_the_dp_seed_and_leaves_the_split_and_the_input_alone():
    original = yaml.safe_load(DPSGD_DIGITS.read_text())
    seeded = seeded_config(original, 7)
    assert seeded["seed_everything"] == 7
    assert seeded["dp"]["seed"] == 7
    assert seeded["data"] == original["data"] and "seed" not in (seeded["data"].get("init_args") or {})
    assert original == yaml.safe_load(DPSGD_DIGITS.read_text())
    assert seeded_config(DPSGD_DIGITS, 7) == seeded


def test_non_private_configs_get_only_the_global_seed():
    seeded = seeded_config(CONFIG_DIR / "erm" / "digits.yaml", 3)
    assert seeded["seed_everything"] == 3
    assert seeded.get("dp") is None


def _initial_weights(seed: int) -> tuple[torch.Tensor, object]:
    cli = build_recipe(seeded_config(DPSGD_DIGITS, seed), ["--trainer.logger=false"])
    weights = torch.cat([p.detach().flatten() for p in cli.model.parameters()])
    return weights, find_dp_callback(cli.trainer)


def test_the_seed_reaches_the_model_initialization_and_the_dp_callback():
    first, dp = _initial_weights(1)
    again, _ = _initial_weights(1)
    other, other_dp = _initial_weights(2)
    assert torch.equal(first, again) and not torch.equal(first, other)
    assert dp.randomness.seed == 1 and other_dp.randomness.seed == 2


def test_sweep_reports_mean_and_sample_std_with_the_seed_list():
    values = {0: 0.91, 1: 0.93, 4: 0.96}
    result = sweep(lambda seed: {"acc": values[seed], "seed": seed}, [0, 1, 4])
    assert result.seeds == [0, 1, 4] and result.values("seed").tolist() == [0, 1, 4]
    mean, std = result.mean_std("acc")
    assert mean == pytest.approx(statistics.mean(values.values()))
    assert std == pytest.approx(statistics.stdev(values.values()))
    assert result.cell("acc", scale=100) == f"{100 * mean:.2f} +- {100 * std:.2f}"
    assert result.note() == "mean +- sample standard deviation over 3 seeds (0, 1, 4)"


def test_a_single_seed_is_labelled_as_a_single_run():
    result = sweep(lambda seed: {"acc": 0.5}, [3])
    assert result.cell("acc", 100) == "50.00 (1 seed)" and result.note() == "single run (seed 3)"


@pytest.mark.parametrize("seeds", [[], [0, 0]])
def test_empty_or_repeated_seeds_are_refused(seeds):
    with pytest.raises(ValueError, match="seeds must be distinct"):
        sweep(lambda seed: {}, seeds)


def test_a_metric_missing_from_a_run_names_the_seed():
    result = Sweep(seeds=[0, 1], runs=[{"a": 1.0}, {"b": 2.0}])
    with pytest.raises(KeyError, match=r"'a' missing for seeds \[1\]"):
        result.values("a")


def test_sweeps_saved_by_separate_processes_merge_in_seed_order(tmp_path):
    sweep(lambda seed: {"acc": 0.1 * seed}, [2]).save(tmp_path / "b.json")
    sweep(lambda seed: {"acc": 0.1 * seed}, [0, 1]).save(tmp_path / "a.json")
    merged = Sweep.merge([tmp_path / "b.json", tmp_path / "a.json"])
    assert merged.seeds == [0, 1, 2] and merged.values("acc").tolist() == pytest.approx([0.0, 0.1, 0.2])
    with pytest.raises(ValueError, match="repeat a seed"):
        Sweep.merge([tmp_path / "a.json", tmp_path / "a.json"])


SPREAD_CALLS = re.compile(r"\.std\(|\bstdev\(|\bpstdev\(|\bddof\b|\bnanstd\(|\.var\(|\bvariance\(")


def test_the_shared_helper_is_the_only_place_a_benchmark_computes_a_spread():
    """Every printed spread is the sample std of :func:`seeds.mean_std` (a script computing its own printed the
    population std where the docs promised the sample std)."""
    folder = Path(__file__).resolve().parents[1] / "benchmarks"
    offenders = [
        f"{path.name}:{number}"
        for path in sorted(folder.rglob("*.py"))
        if path.name != "seeds.py"
        for number, line in enumerate(path.read_text().splitlines(), start=1)
        if SPREAD_CALLS.search(line.split("#")[0])
    ]
    assert not offenders, f"compute spreads with seeds.mean_std / seeds.spread_cell: {offenders}"


def test_the_spread_is_the_sample_std():
    assert seeds.mean_std([1.0, 2.0, 3.0]) == (2.0, 1.0)
    assert seeds.spread_cell([1.0, 2.0, 3.0], digits=1) == "2.0 +- 1.0"
    assert seeds.spread_cell([4.0]) == "4.00 (1 seed)"
    assert seeds.spread_cell([float("inf")] * 3) == "inf"  # no guarantee in any seed: no 'inf +- nan'
    assert seeds.spread_cell([1.0, float("inf"), 2.0]) == "not finite in 1 of 3 seeds"
