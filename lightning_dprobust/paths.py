"""Where the shipped folders are: the top-level ``zoo/`` and ``configs/`` of a source checkout, else the copies a
wheel carries under ``lightning_dprobust/_data/`` (made by ``setup.py``'s build step from the same folders)."""

from __future__ import annotations

from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent


def shipped_root() -> Path:
    """The folder holding ``zoo/`` and ``configs/``: the source checkout's root, or the wheel's ``_data`` folder."""
    checkout = PACKAGE_DIR.parent
    if (checkout / "zoo" / "entries").is_dir() and (checkout / "configs").is_dir():
        return checkout
    return PACKAGE_DIR / "_data"
