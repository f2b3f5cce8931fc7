"""Report helpers shared by the evaluation commands: markdown tables and offline W&B runs."""

from __future__ import annotations

import netrc
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

WANDB_PROJECT = "dprobust"


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[Any]], align: str | None = None) -> str:
    """A GitHub markdown table; cells are converted with ``str``.

    Args:
        header: column titles.
        rows: one sequence of cells per row, each as long as ``header``.
        align: one character per column, ``"l"`` (left) or ``"r"`` (right); default: first column left, others right.

    Raises:
        ValueError: if a row or ``align`` does not have one entry per column.

    Example:
        >>> print(markdown_table(["model", "acc"], [["a", 0.5]]))
        | model | acc |
        |:--|--:|
        | a | 0.5 |
    """
    align = align or "l" + "r" * (len(header) - 1)
    widths = {len(align), *(len(row) for row in rows)}
    if widths != {len(header)} or set(align) - {"l", "r"}:
        raise ValueError(f"every row and align ({align!r}, of 'l'/'r') need {len(header)} entries, one per column")
    separator = "|" + "|".join(":--" if a == "l" else "--:" for a in align) + "|"
    lines = [_row(header), separator, *(_row(row) for row in rows)]
    return "\n".join(lines)


def _row(cells: Sequence[Any]) -> str:
    return "| " + " | ".join(str(cell) for cell in cells) + " |"


def write_text(text: str, path: str | os.PathLike) -> Path:
    """Write ``text`` plus a final newline to ``path``, creating its folder; return the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n")
    return path


def check_wandb_login(flag: str = "--no-wandb") -> None:
    """Refuse, before any work, an online W&B run without an API key (``WANDB_API_KEY`` or ``wandb login``): W&B
    would otherwise fail at the end of the run with a traceback, or stop to ask for a key."""
    if os.environ.get("WANDB_MODE", "offline") != "online" or os.environ.get("WANDB_API_KEY"):
        return
    try:
        netrc_file = os.environ.get("NETRC") or str(Path.home() / ".netrc")
        host = (os.environ.get("WANDB_BASE_URL") or "https://api.wandb.ai").split("://")[-1].split("/")[0]
        if netrc.netrc(netrc_file).authenticators(host):
            return
    except (OSError, netrc.NetrcParseError):
        pass
    raise ValueError(
        f"WANDB_MODE=online but no W&B API key is set: run `wandb login`, set WANDB_API_KEY, unset WANDB_MODE to log "
        f"offline, or pass {flag}"
    )


def log_wandb(
    out_dir: str | os.PathLike,
    job_type: str,
    config: Mapping[str, Any],
    metrics: Mapping[str, float],
    images: Mapping[str, str | os.PathLike] | None = None,
    project: str | None = None,
    entity: str | None = None,
    group: str | None = None,
) -> Path | None:
    """Log ``metrics`` (and PNG ``images`` as ``wandb.Image``) in one W&B run under ``out_dir/wandb``, in ``project``
    (default ``dprobust``), ``entity`` (default: the user's) and ``group``.

    The run is offline unless the environment sets ``WANDB_MODE`` (``online``, ``disabled``, ...); an offline run
    can be uploaded later with ``wandb sync``. Returns the run's folder, or ``None`` when W&B is disabled.
    """
    import wandb

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    mode = os.environ.get("WANDB_MODE", "offline")
    run = wandb.init(
        mode=mode,
        dir=out_dir,
        project=project or WANDB_PROJECT,
        entity=entity,
        group=group,
        job_type=job_type,
        config=dict(config),
    )
    try:
        payload: dict[str, Any] = dict(metrics)
        payload.update({key: wandb.Image(str(path)) for key, path in (images or {}).items()})
        run.log(payload)
    finally:
        run.finish()
    return None if mode == "disabled" else Path(run.dir).parent
