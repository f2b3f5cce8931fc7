"""Fixtures shared by the core tests."""

from __future__ import annotations

import pytest
import torch

from lightning_dprobust.core.per_sample import tf32_settings


@pytest.fixture
def double_precision():
    """float64 as the default dtype for one test, so that tight agreement tests the algebra, not float32 rounding."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(previous)


@pytest.fixture
def tf32_on():
    """TF32 on for cuDNN convolutions and CUDA matrix products, as a caller may set it, for one test; restored after."""
    with tf32_settings(cudnn=True, matmul=True):
        yield


@pytest.fixture
def default_tf32():
    """torch's default TF32 settings for one test, whatever they were before (cuDNN convolutions on, CUDA matrix
    products off); restored after."""
    with tf32_settings(cudnn=True, matmul=False):
        yield
