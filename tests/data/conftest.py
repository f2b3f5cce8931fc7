"""Fixtures of the data-module tests; the fake-dataset writers live in ``fake_data.py``."""

from __future__ import annotations

from urllib.error import URLError

import pytest


@pytest.fixture
def no_network(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make every URL open fail as it does offline, so download paths run without a network."""

    def refuse(*args, **kwargs):
        raise URLError("network is unreachable (test)")

    monkeypatch.setattr("urllib.request.urlopen", refuse)
