"""Fixtures shared by the core tests."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture
def double_precision():
    """float64 as the default dtype for one test, so that tight agreement tests the algebra, not float32 rounding."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(previous)
