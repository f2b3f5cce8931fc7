"""Choice of the per-example clipping engine: ``"vmap"`` (any model), ``"ghost"`` (per-layer rules) or ``"auto"``.

* ``vmap``: :class:`~lightning_dprobust.core.per_sample.PerExampleClipper`, ``torch.func`` per-example gradients;
  structurally exact for any per-example loss, at the cost of materializing every example's gradient.
* ``ghost``: :class:`~lightning_dprobust.core.ghost.GhostClipper`, ghost norms / book-keeping (Bu et al. 2023);
  one batched forward and backward plus per-layer norms; parameters without a rule fall back to vmap.
* ``auto``: ``ghost`` when every trainable parameter has a layer rule (and, at the first step, its norms agree
  with vmap's on a few examples, else it switches to vmap), otherwise ``vmap``. A check that fails after ghost
  results were released stops the run under ``auto`` too (``on_late_mismatch``).

Both engines return the same :class:`~lightning_dprobust.core.per_sample.ClippedSum` with the same guarantee, on one
assumption the ghost engine cannot check at every step: the per-example loss does not mix examples. ``vmap`` computes
each example's loss alone, so no loss term can; ``ghost`` computes the batch at once and compares its norms with
``vmap``'s, in training mode, at the first step and every :data:`~lightning_dprobust.core.ghost.CHECK_EVERY` steps
after, so a loss that starts to mix examples during training is found at the next check, not at once, and stops the
run (use ``vmap`` for such losses).
"""

from __future__ import annotations

from collections.abc import Collection

from torch import nn

from lightning_dprobust.core.ghost import GhostClipper
from lightning_dprobust.core.ghost.plan import plan_rules
from lightning_dprobust.core.per_sample import PerExampleClipper

ENGINES = ("auto", "vmap", "ghost")


def build_clipper(
    engine: str,
    module: nn.Module,
    loss_method: str,
    max_grad_norm: float,
    max_physical_batch_size: int | None = None,
    clipping: str = "flat",
    parameter_names: Collection[str] | None = None,
    on_late_mismatch: str = "raise",
    probe: bool = False,
) -> tuple[PerExampleClipper | GhostClipper, str]:
    """The clipper for ``engine`` and a one-line description of the choice (for the log); ``parameter_names``
    restricts both engines to those trainable parameters (default: all); ``on_late_mismatch`` and ``probe``: see
    :class:`~lightning_dprobust.core.ghost.GhostClipper`."""
    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {ENGINES}, got {engine!r}")
    args = (module, loss_method, max_grad_norm, max_physical_batch_size, clipping)
    if engine == "vmap":
        return PerExampleClipper(*args, parameter_names), "vmap (torch.func per-example gradients), as requested"
    if engine == "ghost":
        clipper = GhostClipper(
            *args,
            on_mismatch="raise",
            parameter_names=parameter_names,
            on_late_mismatch=on_late_mismatch,
            probe=probe,
        )
        return clipper, f"ghost ({clipper.describe()}), as requested"
    _, leftover = plan_rules(module, parameter_names)
    if leftover:
        return PerExampleClipper(*args, parameter_names), f"vmap (auto: no ghost rule for {leftover})"
    clipper = GhostClipper(
        *args, on_mismatch="fallback", parameter_names=parameter_names, on_late_mismatch=on_late_mismatch, probe=probe
    )
    return clipper, f"ghost (auto: {clipper.describe()})"
