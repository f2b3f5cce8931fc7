"""The ghost engine: per-example clipping from activations and output gradients (ghost norms and book-keeping).

``clipper.py`` holds the engine (:class:`GhostClipper`); ``plan.py`` gives each layer its rule, looked up in
``registry.py``, where the rules of ``layers.py``, ``conv.py``, ``norms.py``, ``embedding.py`` and ``tokens.py`` are
registered per layer type (:func:`register_rule`); ``functional.py`` captures parameters used outside layer calls on
the autograd graph; ``graph.py`` is the per-step graph check.
"""

from lightning_dprobust.core.ghost.clipper import (
    CHECK_EVERY,
    PROBE_EXAMPLES,
    VERIFY_EXAMPLES,
    EngineMismatch,
    GhostClipper,
    check_rows,
    streamed_rules,
)
from lightning_dprobust.core.ghost.plan import plan_rules
from lightning_dprobust.core.ghost.registry import register_rule

__all__ = [
    "CHECK_EVERY",
    "PROBE_EXAMPLES",
    "VERIFY_EXAMPLES",
    "EngineMismatch",
    "GhostClipper",
    "check_rows",
    "plan_rules",
    "register_rule",
    "streamed_rules",
]
