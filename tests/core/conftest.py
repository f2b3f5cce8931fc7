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


@pytest.fixture
def tf32_on():
    """TF32 on for cuDNN convolutions and CUDA matrix products, as a caller may set it, for one test; restored after."""
    previous = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = True
    yield
    torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = previous


@pytest.fixture
def default_tf32():
    """torch's default TF32 settings for one test, whatever they were before (cuDNN convolutions on, CUDA matrix
    products off); restored after."""
    previous = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = True, False
    yield
    torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = previous
