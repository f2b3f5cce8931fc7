"""``dp_engine``: runs a test once per per-example clipping engine.

A privacy test module opts in with ``pytestmark = pytest.mark.usefixtures("dp_engine")``: every ``DPCallback`` built
with the default ``engine="auto"`` then uses the fixture's engine instead, and the fixture checks afterwards that each
clipper the callback built is that engine's class, so the parametrization cannot silently test one engine twice.
"""

from __future__ import annotations

import pytest

from lightning_dprobust.callbacks import dp as dp_callback
from lightning_dprobust.core.ghost import GhostClipper
from lightning_dprobust.core.per_sample import PerExampleClipper

ENGINE_CLASSES = {"vmap": PerExampleClipper, "ghost": GhostClipper}


@pytest.fixture(params=list(ENGINE_CLASSES))
def dp_engine(request, monkeypatch) -> str:
    engine, built = request.param, []
    real = dp_callback.build_clipper

    def build_clipper(requested: str, *args, **kwargs):
        clipper, choice = real(engine if requested == "auto" else requested, *args, **kwargs)
        built.append(clipper)
        return clipper, choice

    monkeypatch.setattr(dp_callback, "build_clipper", build_clipper)
    yield engine
    assert all(type(clipper) is ENGINE_CLASSES[engine] for clipper in built), (engine, built)
