"""Model registry: ``register_model``, ``list_models`` and ``create_model``.

The registry follows timm's (Wightman 2019, https://github.com/huggingface/pytorch-image-models): a decorator adds a
builder under a name, ``list_models`` filters names with shell patterns, and ``create_model`` builds by name and
drops ``None`` keyword arguments so YAML nulls do not override defaults. Unlike timm, a duplicate name is an error.
Every model comes back behind its input normalization (:class:`NormalizedModel`), because data modules yield images
in ``[0, 1]`` (docs/design.md, contract 1).
"""

from __future__ import annotations

import difflib
import fnmatch
from collections.abc import Callable, Sequence
from typing import Any

from torch import nn

from lightning_dprobust.models.normalize import Normalize, NormalizedModel
from lightning_dprobust.models.timm_models import TIMM_PREFIX, create_timm_model, is_timm_model, list_timm_models

ModelBuilder = Callable[..., nn.Module]

_MODELS: dict[str, ModelBuilder] = {}


def register_model(name: str, *, force: bool = False) -> Callable[[ModelBuilder], ModelBuilder]:
    """Return a decorator that registers a model builder under ``name``.

    The builder is called as ``builder(num_classes=..., input_shape=(C, H, W), **kwargs)`` and returns the bare
    network (without normalization); it is returned unchanged by the decorator.

    Args:
        name: the registry key; must be non-empty and must not start with ``timm/`` (reserved for timm).
        force: replace an existing entry instead of raising.

    Raises:
        ValueError: if ``name`` is empty, uses the ``timm/`` prefix, or is taken and ``force`` is false.

    Example:
        >>> @register_model("tiny_linear")
        ... def tiny_linear(*, num_classes, input_shape):
        ...     return nn.Sequential(nn.Flatten(), nn.Linear(input_shape[0] * input_shape[1] * input_shape[2],
        ...                          num_classes))
        >>> "tiny_linear" in list_models()
        True
        >>> _ = _MODELS.pop("tiny_linear")
    """
    if not name or name.startswith(TIMM_PREFIX):
        raise ValueError(f"invalid model name {name!r}: use a non-empty name without the reserved '{TIMM_PREFIX}'")
    if name in _MODELS and not force:
        raise ValueError(f"model '{name}' is already registered: pick another name or pass force=True to replace it")

    def decorator(builder: ModelBuilder) -> ModelBuilder:
        _MODELS[name] = builder
        return builder

    return decorator


def list_models(pattern: str = "*") -> list[str]:
    """Return the sorted model names matching the shell pattern ``pattern`` (``fnmatch`` rules).

    Registered models are always searched. timm architectures, named ``timm/<arch>``, are searched only when the
    pattern starts with ``timm/`` (``list_models("timm/resnet*")``), so the default listing stays short.
    """
    names = list(_MODELS)
    if pattern.startswith(TIMM_PREFIX):
        names += list_timm_models()
    return sorted(fnmatch.filter(names, pattern))


def _unknown_model_error(name: str) -> ValueError:
    matches = difflib.get_close_matches(name, list(_MODELS) + list_timm_models(), n=5)
    hint = f" Did you mean: {', '.join(matches)}?" if matches else ""
    return ValueError(
        f"unknown model '{name}'.{hint} See the registered models with lightning_dprobust.models.list_models() "
        "and timm architectures (used as 'timm/<arch>') with list_models('timm/*')."
    )


def _channel_stats(values: Sequence[float] | None, default: float, channels: int, what: str) -> list[float]:
    if values is None:
        return [default] * channels
    values = list(values)
    if len(values) != channels:
        raise ValueError(f"{what} needs one value per input channel ({channels}), got {values}")
    return values


def create_model(
    name: str,
    *,
    num_classes: int,
    input_shape: Sequence[int],
    mean: Sequence[float] | None = None,
    std: Sequence[float] | None = None,
    pretrained: bool = False,
    **kwargs: Any,
) -> NormalizedModel:
    """Build model ``name`` for ``input_shape`` images and ``num_classes`` classes, behind its normalization.

    Args:
        name: a registered name (see :func:`list_models`) or ``timm/<arch>`` for any timm architecture, which is
            built by ``timm.create_model`` and made DP-compatible (BatchNorm -> GroupNorm, no in-place modules).
        num_classes: number of output logits.
        input_shape: ``(C, H, W)`` of the unnormalized ``[0, 1]`` images the model will receive.
        mean: per-channel mean subtracted first; ``None`` means 0.
        std: per-channel standard deviation divided by next; ``None`` means 1.
        pretrained: load pretrained weights (timm models only; registered models come from the zoo instead).
        **kwargs: passed to the builder; entries that are ``None`` are dropped.

    Returns:
        ``NormalizedModel(normalize=Normalize(mean, std), net=...)`` whose forward takes ``[0, 1]`` images.

    Raises:
        ValueError: for an unknown name (with close matches), a malformed ``input_shape``, ``num_classes < 1``,
            ``mean``/``std`` not of length ``C``, or ``pretrained=True`` for a registered model.
        PretrainedWeightsError: if timm's pretrained weights could not be fetched (see :func:`create_timm_model`).

    Example:
        >>> model = create_model("cnn_tanh", num_classes=10, input_shape=(1, 28, 28))
        >>> sum(p.numel() for p in model.net.parameters())
        26010
    """
    shape = tuple(int(s) for s in input_shape)
    if len(shape) != 3 or min(shape) < 1:
        raise ValueError(f"input_shape must be (C, H, W) with positive entries, got {input_shape}")
    if num_classes < 1:
        raise ValueError(f"num_classes must be >= 1, got {num_classes}")
    kwargs = {key: value for key, value in kwargs.items() if value is not None}
    if name.startswith(TIMM_PREFIX) and is_timm_model(name[len(TIMM_PREFIX) :]):
        arch = name[len(TIMM_PREFIX) :]
        net = create_timm_model(arch, num_classes=num_classes, in_chans=shape[0], pretrained=pretrained, **kwargs)
    elif name in _MODELS:
        if pretrained:
            raise ValueError(
                f"registered model '{name}' has no pretrained weights to fetch: build it with pretrained=False and "
                "load a checkpoint (lightning_dprobust.zoo) instead"
            )
        net = _MODELS[name](num_classes=num_classes, input_shape=shape, **kwargs)
    else:
        raise _unknown_model_error(name)
    normalize = Normalize(_channel_stats(mean, 0.0, shape[0], "mean"), _channel_stats(std, 1.0, shape[0], "std"))
    return NormalizedModel(normalize, net)
