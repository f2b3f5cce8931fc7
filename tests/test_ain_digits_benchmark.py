"""benchmarks/ain_digits.py: one AIN trained per final bound (thesis section 5.2.3), each attacking at its own bound,
conditioned on the classifier's prediction unless the row says true label."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from lightning_dprobust.models import AINGenerator
from tests.helpers import load_benchmark, trained_digits_classifier

bench = load_benchmark("ain_digits")


def test_one_ain_is_trained_per_bound_and_mode_and_attacks_at_its_own_bound(monkeypatch):
    model, x, y = trained_digits_classifier()
    trained, attacks = [], []

    def train_ain(seed, target_class, epochs, bound):
        trained.append((target_class, bound))
        generator = AINGenerator(10, (1, 8, 8), channels=(4, 4, 4, 4), attention_channels=4)
        generator.bound.fill_(bound)
        return SimpleNamespace(generator=generator, bound=bound)

    def attack(name, model, eps, target_class, ain, seed):
        built = make(name, model, eps, target_class, ain, seed)
        attacks.append((name, eps, float(ain.bound), getattr(built, "condition", None)))
        return built

    make = bench._attack
    monkeypatch.setattr(bench, "train_ain", train_ain)
    monkeypatch.setattr(bench, "_attack", attack)
    monkeypatch.setattr(bench, "ATTACKS", ("AIN", "AIN (true label)", "i-FGSM"))
    metrics, ains = bench.attack_success(0, 1, model, x[:32], y[:32])
    assert trained == [(c, eps) for c in (bench.TARGET_CLASS, None) for eps in bench.BOUNDS]
    assert [float(ain.generator.bound) for ain in ains["untargeted"].values()] == pytest.approx(list(bench.BOUNDS))
    ain_runs = [(name, eps, bound, condition) for name, eps, bound, condition in attacks if name.startswith("AIN")]
    assert all(eps == pytest.approx(bound) for _, eps, bound, _ in ain_runs) and len(ain_runs) == 2 * 2 * len(
        bench.BOUNDS
    )
    assert {name: condition for name, _, _, condition in ain_runs} == {
        "AIN": "prediction",
        "AIN (true label)": "true_label",
    }
    assert all(0 <= metrics[f"untargeted/{name}/{eps}"] <= 1 for name in bench.ATTACKS for eps in bench.BOUNDS)
