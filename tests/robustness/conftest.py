"""A digits classifier trained once for the robustness tests (attacks need a model that classifies correctly)."""

from __future__ import annotations

import pytest

from tests.helpers import trained_digits_classifier


@pytest.fixture(scope="session")
def digits_classifier():
    """``(model, test images, test labels)``; the model's parameters are frozen, as during an attack."""
    model, x, y = trained_digits_classifier()
    for p in model.parameters():
        p.requires_grad_(False)
    return model, x, y
