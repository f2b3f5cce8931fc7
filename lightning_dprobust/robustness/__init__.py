"""Robustness: the adversarial attack suite, robust accuracy, SmoothAdv, per-example robustness metrics, and PixelDP
certified inference.

Submodules are imported on first use (``from lightning_dprobust.robustness import build_attack`` works), so that
importing the package, e.g. for the ``dprobust`` subcommands, does not load torchattacks.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "ATTACKS": "attacks",
    "L2_ATTACKS": "attacks",
    "SmoothAdv": "attacks",
    "attack_guard": "attacks",
    "build_attack": "attacks",
    "format_table": "attacks",
    "preserve_modes": "attacks",
    "robust_accuracy": "attacks",
    "smoothed_cross_entropy": "attacks",
    "input_gradient_norm": "per_sample",
    "input_hessian_top_eigenvalue": "per_sample",
    "local_lipschitz": "per_sample",
    "PixelDPMechanism": "pixeldp",
    "certify_pixeldp": "pixeldp",
    "pixeldp_metrics": "pixeldp",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
