"""benchmarks/transdenoiser_jacobians.py: each row is measured in a fresh process and differentiates the slice it
names, for every image asked, whatever the chunk size."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
try:
    import transdenoiser_jacobians
finally:
    sys.path.remove(str(ROOT / "benchmarks"))


def test_a_child_measures_the_jacobians_of_the_named_slice_for_every_image():
    width, channels, pixels = 4, 1, 28 * 28
    first = transdenoiser_jacobians.measure_in_child(("MNIST", "first", 2, 1), width, 3, 2)
    assert first["shape"] == [2, channels * width * 9 + width, pixels]  # conv weight + bias of the first layer
    last = transdenoiser_jacobians.measure_in_child(("MNIST", "last", 2, 2), width, 3, 2)
    assert last["shape"] == [2, width * channels * 9 + channels, pixels]
    assert all(isinstance(result["peak_gb"], float) for result in (first, last))
