"""Checkpoint zoo: the hub (``list``, ``info``, ``download``, ``load``), the catalog schema and the build.

``from lightning_dprobust import zoo`` gives the hub's functions (:mod:`lightning_dprobust.zoo.hub`);
:mod:`~lightning_dprobust.zoo.catalog` is the entry schema and :mod:`~lightning_dprobust.zoo.build` trains an entry
from its recipe.
"""

from __future__ import annotations

from typing import Any

from lightning_dprobust.zoo.catalog import (
    CatalogError,
    ChecksumError,
    DownloadError,
    Entry,
    NotShippedError,
    UnknownEntryError,
    UnsafeCheckpointError,
    ZooError,
)
from lightning_dprobust.zoo.hub import (
    ZOO_DIR,
    Zoo,
    download,
    fit_state_dict,
    info,
    list_entries,
    load,
    read_state_dict,
    sha256_file,
)


def __getattr__(attribute: str) -> Any:
    """``zoo.list`` is :func:`list_entries`; resolved here so the builtin ``list`` stays usable in this package."""
    if attribute == "list":
        return list_entries
    raise AttributeError(f"module {__name__!r} has no attribute {attribute!r}")


__all__ = [
    "ZOO_DIR",
    "CatalogError",
    "ChecksumError",
    "DownloadError",
    "Entry",
    "NotShippedError",
    "UnknownEntryError",
    "UnsafeCheckpointError",
    "Zoo",
    "ZooError",
    "download",
    "fit_state_dict",
    "info",
    "list_entries",
    "load",
    "read_state_dict",
    "sha256_file",
]
