"""The argument checks every private mechanism shares (``DPCallback``, ``TransDenoiserCallback``, the generative
modules): one wording, ``Owner(name=value) must be ...``, and no boolean taken for a number."""

from __future__ import annotations

import math
from collections.abc import Collection
from typing import Any

from lightning.pytorch.utilities.exceptions import MisconfigurationException


def check_number(owner: str, name: str, value: Any, allow_zero: bool = False, allow_none: bool = True) -> None:
    """``value`` must be a finite number ``> 0`` (``>= 0`` with ``allow_zero``), or ``None`` where allowed."""
    if value is None and allow_none:
        return
    ok = (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and math.isfinite(value)
        and (value >= 0 if allow_zero else value > 0)
    )
    if not ok:
        bound = ">= 0" if allow_zero else "> 0"
        raise MisconfigurationException(
            f"{owner}({name}={value!r}) must be a finite number {bound}" + (" or None" if allow_none else "")
        )


def check_choice(owner: str, name: str, value: Any, choices: Collection[Any]) -> None:
    if value not in choices:
        raise MisconfigurationException(f"{owner}({name}={value!r}) must be one of {tuple(choices)}")


def check_flag(owner: str, name: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise MisconfigurationException(f"{owner}({name}={value!r}) must be True or False")


def check_mechanism(owner: str, max_grad_norm: Any, noise_multiplier: Any, accountant: Any, engine: Any) -> None:
    """What every DP-SGD release needs: a clip bound, a noise multiplier (``None``: calibrated or no DP), an
    accountant and an engine (:mod:`~lightning_dprobust.core.engines`)."""
    from lightning_dprobust.core.accounting import ACCOUNTANTS
    from lightning_dprobust.core.engines import ENGINES

    check_number(owner, "max_grad_norm", max_grad_norm, allow_none=False)
    check_number(owner, "noise_multiplier", noise_multiplier, allow_zero=True)
    check_choice(owner, "accountant", accountant, ACCOUNTANTS)
    check_choice(owner, "engine", engine, ENGINES)
