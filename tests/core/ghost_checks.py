"""Test helpers for the ghost engine's comparisons against the vmap engine: off, or counted."""

from __future__ import annotations

from lightning_dprobust.core.ghost import GhostClipper


def without_vmap_checks(ghost: GhostClipper) -> GhostClipper:
    """``ghost`` with its comparisons against the vmap engine off (the first step's, the periodic ones, and those of
    the layers first called at a later step), so that a test sees what the rules and the structural checks do on
    their own: a failed comparison would otherwise hand a parameter to the vmap engine, and the test would compare
    that engine with itself."""
    ghost._verified = True
    ghost.check_every = None
    ghost._added_after_check = lambda what, names: None
    return ghost


def counting_checks(ghost: GhostClipper, monkeypatch) -> list[int]:
    """The batch sizes of ``ghost``'s comparisons against the vmap engine, appended as they run."""
    checks, verify = [], ghost._verify
    monkeypatch.setattr(ghost, "_verify", lambda batch: checks.append(batch[0].shape[0]) or verify(batch))
    return checks
