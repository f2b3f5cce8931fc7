"""Make a network fit for per-example gradient clipping (DP-SGD).

DP-SGD (Abadi et al. 2016, https://arxiv.org/abs/1607.00133) bounds each example's influence by clipping that
example's gradient. A layer that mixes the examples of a batch breaks the bound: BatchNorm's batch statistics make
one example's output, and so its gradient, depend on every other example, and its running statistics are a
non-private summary of the data. GroupNorm (Wu and He 2018, https://arxiv.org/abs/1803.08494) normalizes each example
on its own and is the standard replacement (as in Opacus' ``ModuleValidator.fix``). In-place activations are also
removed: they overwrite tensors that per-example gradient hooks (Opacus) keep for the backward pass. An embedding
with ``max_norm`` renormalizes the table rows each batch looks up, in place, outside the noisy update: the released
table would show which tokens the private data held.
"""

from __future__ import annotations

import math

from timm.layers import GroupNormAct
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm
from torch.nn.modules.instancenorm import _InstanceNorm

_FIX = "lightning_dprobust.models.make_dp_compatible"


def _group_norm_for(bn: _BatchNorm, num_groups: int) -> nn.Module:
    """Build the GroupNorm that replaces ``bn``, keeping a fused activation (timm ``BatchNormAct2d``) if any."""
    channels = bn.num_features
    groups = math.gcd(num_groups, channels)
    if hasattr(bn, "act"):
        gn: nn.Module = GroupNormAct(channels, num_groups=groups, eps=bn.eps, affine=True, apply_act=False)
        gn.act = bn.act
        gn.drop = getattr(bn, "drop", nn.Identity())
    else:
        gn = nn.GroupNorm(groups, channels, eps=bn.eps, affine=True)
    reference = bn.weight if bn.weight is not None else bn.running_mean
    if reference is not None:
        gn = gn.to(device=reference.device, dtype=reference.dtype)
    return gn.train(bn.training)


def _drop_running_stats(norm: _InstanceNorm) -> None:
    """Make an InstanceNorm use per-example statistics in every mode and forget the batch-wide running ones."""
    norm.track_running_stats = False
    norm.running_mean = None
    norm.running_var = None
    norm.num_batches_tracked = None


def make_dp_compatible(model: nn.Module, num_groups: int = 32) -> nn.Module:
    """Replace every cross-example or in-place layer of ``model`` so per-example gradients are well defined.

    Changes, made in place:

    1. Every ``torch.nn.modules.batchnorm._BatchNorm`` instance, subclasses included (``BatchNorm1d/2d/3d``,
       ``SyncBatchNorm``, timm's ``BatchNormAct2d``), becomes ``GroupNorm(gcd(num_groups, C), C)`` with fresh
       affine parameters (weight 1, bias 0). A norm with a fused activation (timm's ``BatchNormAct2d``, which has
       ``act`` and ``drop`` children) becomes a ``timm.layers.GroupNormAct`` that keeps the same ``act`` and
       ``drop`` modules. Running statistics are discarded: batch statistics do not carry over to per-group ones.
    2. An ``InstanceNorm`` with ``track_running_stats=True`` stops tracking them and always uses per-example
       statistics.
    3. Every module with an ``inplace`` attribute gets ``inplace=False``.
    4. Every ``nn.Embedding`` gets ``max_norm=None`` (no in-place renormalization of the looked-up rows) and
       ``sparse=False`` (the noise makes the gradient dense anyway, and ``vmap`` forms no sparse per-example
       gradients).

    Guarantees: afterwards :func:`dp_incompatibilities` returns ``[]`` and no ``_BatchNorm`` instance remains.
    Replacements sit on the device and dtype of the module they replace. Shared submodules are replaced once and
    stay shared.

    Assumptions: the model does not mix examples through functional code in its ``forward`` (for example
    ``F.batch_norm`` called directly); module inspection cannot see that.

    Args:
        model: the network to fix.
        num_groups: the largest number of GroupNorm groups; each layer uses ``gcd(num_groups, C)`` so the group
            count always divides its ``C`` channels.

    Returns:
        ``model`` itself, or the replacement if ``model`` is itself a BatchNorm layer.

    Raises:
        ValueError: if ``num_groups < 1``.
    """
    if num_groups < 1:
        raise ValueError(f"num_groups must be >= 1, got {num_groups}: GroupNorm needs at least one group")
    if isinstance(model, _BatchNorm):
        return make_dp_compatible(_group_norm_for(model, num_groups), num_groups)
    replacements: dict[int, nn.Module] = {}
    for parent in list(model.modules()):
        for child_name, child in list(parent.named_children()):
            if isinstance(child, _BatchNorm):
                if id(child) not in replacements:
                    replacements[id(child)] = _group_norm_for(child, num_groups)
                setattr(parent, child_name, replacements[id(child)])
    for module in model.modules():
        if isinstance(module, _InstanceNorm) and module.track_running_stats:
            _drop_running_stats(module)
        if getattr(module, "inplace", False) is True:
            module.inplace = False
        if isinstance(module, nn.Embedding):
            module.max_norm, module.sparse = None, False
    return model


def _problem(module: nn.Module) -> str | None:
    """Describe why ``module`` breaks per-example gradients, or return ``None`` if it does not."""
    kind = type(module).__name__
    if isinstance(module, _BatchNorm):
        return f"{kind} mixes examples of a batch (replace with GroupNorm: {_FIX})"
    if isinstance(module, _InstanceNorm) and module.track_running_stats:
        return f"{kind} tracks running statistics across examples (set track_running_stats=False: {_FIX})"
    if getattr(module, "inplace", False) is True:
        return f"{kind} has inplace=True, which overwrites tensors saved for per-example gradients ({_FIX})"
    if isinstance(module, nn.Embedding) and module.max_norm is not None:
        return (
            f"{kind} has max_norm={module.max_norm}: it renormalizes the rows each batch looks up in place, without "
            f"noise, so the released table shows which tokens the private data held (set max_norm=None: {_FIX})"
        )
    if isinstance(module, nn.Embedding) and module.sparse:
        return (
            f"{kind} has sparse=True: the vmap engine cannot form its per-example gradients, and the noise makes "
            f"every update dense anyway (set sparse=False: {_FIX})"
        )
    return None


def dp_incompatibilities(model: nn.Module) -> list[str]:
    """List the modules of ``model`` that break per-example gradient clipping, one readable line each.

    Flagged: every ``_BatchNorm`` instance (subclasses included, e.g. ``SyncBatchNorm`` and timm's
    ``BatchNormAct2d``), every ``InstanceNorm`` with ``track_running_stats=True``, every module with
    ``inplace=True``, and every ``nn.Embedding`` with ``max_norm`` or ``sparse=True``. Each line starts with the
    module's qualified name (``"(root)"`` for ``model`` itself), e.g.
    ``"net.layer1.0.bn1: BatchNorm2d mixes examples of a batch (replace with GroupNorm: ...)"``.

    Args:
        model: the network to inspect; it is not modified.

    Returns:
        The problems in module order; an empty list means the model is compatible.
    """
    lines = []
    for name, module in model.named_modules():
        problem = _problem(module)
        if problem is not None:
            lines.append(f"{name or '(root)'}: {problem}")
    return lines


__all__ = ["dp_incompatibilities", "make_dp_compatible"]
