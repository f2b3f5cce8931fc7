"""benchmarks/stobatch_digits.py: the PixelDP certified columns (StoBatch only) next to the attacked accuracies."""

from __future__ import annotations

import argparse
from types import SimpleNamespace

import pytest
import torch

from tests.helpers import load_benchmark
from tests.robustness.pixeldp_toys import CategoricalMechanism

bench = load_benchmark("stobatch_digits")


class ShrunkMechanism(CategoricalMechanism):
    """A toy mechanism carrying a ``psi`` hyper-parameter, as a trained StoBatch module does; with a class of
    probability 1 every draw votes for it, so every example gets the same radius."""

    def __init__(self, probabilities: list[float], psi: float) -> None:
        super().__init__(probabilities)
        self.hparams = SimpleNamespace(psi=psi)


def _certified(psi: float, eps: list[float]) -> dict[str, float]:
    x, y = torch.zeros(40, 1, 2, 2), torch.tensor([0] * 30 + [1] * 10)
    return bench.certified(ShrunkMechanism([1.0, 0.0], psi), (x, y), 0, argparse.Namespace(n=300, eps=eps))


@pytest.mark.parametrize("psi", [1.0, 2.0])
def test_strict_radius_divides_by_the_modules_psi_and_certifies_only_correct_predictions(psi):
    radii = _certified(psi, [0.0])
    assert radii["radius_scale"] == 0.5
    assert 0 < radii["radius_strict"] <= radii["radius_paper"] / psi
    assert radii["cert_paper@0"] == radii["cert_strict@0"] == pytest.approx(0.75)  # the 10 class-1 examples are wrong
    between = (radii["radius_strict"] + radii["radius_paper"]) / 2
    metrics = _certified(psi, [between])
    assert metrics["cert_paper@" + f"{between:g}"] == pytest.approx(0.75)
    assert metrics["cert_strict@" + f"{between:g}"] == 0.0


def test_table_shows_a_dash_for_methods_without_a_pixeldp_certificate():
    run = {f"{method}/{key}": 0.5 for method in bench.METHODS for key in ("epsilon", "clean")}
    run |= {f"{m}/{label}@0.1": 0.4 for m in bench.METHODS for label in bench.ATTACKS}
    run |= {f"stobatch/cert_{c}@0.1": 0.3 for c in bench.CONDITIONS} | {"stobatch/radius_paper": 0.01}
    run |= {"stobatch/radius_strict": 0.002}
    result = bench.Sweep(seeds=[0, 1], runs=[run, run])
    lines = bench.table(result, argparse.Namespace(eps=[0.1])).splitlines()
    assert "certified 0.1, strict (%)" in lines[0] and "mean radius, paper" in lines[0]
    stobatch, *others = (line.split("|")[-5:-1] for line in lines[2:])
    assert [cell.strip() for cell in stobatch] == [
        "30.00 +- 0.00",
        "30.00 +- 0.00",
        "0.0100 +- 0.0000",
        "0.0020 +- 0.0000",
    ]
    assert all(cell.strip() == "-" for row in others for cell in row)
