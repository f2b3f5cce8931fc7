"""Shared fixtures: small digits training setups for the DP tests."""

from __future__ import annotations

import os
import tempfile

import pytest
import torch

os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("WANDB_SILENT", "true")
# benchmarks run by tests (in this process or as subprocesses) write their result files here, never to results/
os.environ.setdefault("DPROBUST_RESULTS_DIR", tempfile.mkdtemp(prefix="dprobust-test-results-"))


@pytest.fixture(autouse=True)
def _few_threads():
    """Two-core machines: keep intra-op threads low so tests do not oversubscribe."""
    previous = torch.get_num_threads()
    torch.set_num_threads(min(previous, 2))
    yield
    torch.set_num_threads(previous)
