"""Run ``dprobust`` as another version of this library: a copy of a source tree, and processes that import it.

A benchmark that compares versions (``bad_input_probes.py``, ``dpsgd_versions.py``) copies each version's library,
recipes and zoo (:func:`copy_source`; from a checkout such as ``git archive <commit> | tar -x -C DIR``), then runs
each command as its own process (:func:`dprobust_command`) in a fresh folder with :func:`isolated_environment`, so
the two versions share nothing but this interpreter's installed packages.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

LIBRARY_PARTS = ("lightning_dprobust", "configs", "zoo")
RUN_DPROBUST = "import sys; from lightning_dprobust.cli import main; sys.argv[0] = 'dprobust'; sys.exit(main())"


def copy_source(source: Path, target: Path) -> Path:
    """The library, its recipes and its zoo of ``source`` copied to ``target`` (a command may write into its zoo;
    the original stays untouched); returns ``target``."""
    for part in LIBRARY_PARTS:
        shutil.copytree(source / part, target / part, ignore=shutil.ignore_patterns("__pycache__"))
    return target


def dprobust_command(args: list[str]) -> list[str]:
    """``dprobust ARGS`` as this interpreter's process (the library comes from ``PYTHONPATH``)."""
    return [sys.executable, "-c", RUN_DPROBUST, *args]


def isolated_environment(src: Path, folder: Path) -> dict[str, str]:
    """The environment of a process that imports the library at ``src`` and keeps every file it writes (home, zoo
    cache, data, W&B) under ``folder``: one thread, W&B offline, no other ``WANDB_*`` setting inherited."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("WANDB")}
    return env | {
        "PYTHONPATH": str(src),
        "HOME": str(folder / "home"),
        "DPROBUST_HOME": str(folder / "home" / "dprobust"),
        "DPROBUST_DATA": str(folder / "data"),
        "OMP_NUM_THREADS": "1",
        "WANDB_DIR": str(folder),
        "WANDB_MODE": "offline",
    }
