"""The registry of method classes that a checkpoint may name: reading a checkpoint never imports a module.

A checkpoint written by a method records its class as ``"module:QualName"`` (``dprobust_class``). Loading it looks
that name up here; a name that is not registered is refused before anything is imported or instantiated, so a
checkpoint naming ``"os:system"`` or ``"this:DPSGD"`` runs no module code. Every
:class:`~lightning_dprobust.methods.base.ClassifierModule` subclass defined inside ``lightning_dprobust`` registers
itself; a user's own method registers with :func:`~lightning_dprobust.methods.base.register_method`.

This module imports nothing of the package: importing it runs ``lightning_dprobust/methods/__init__.py`` first, which
defines, and so registers, every project method before :func:`method_class` can be called.

Example:
    >>> from lightning_dprobust.methods import DPSGD
    >>> method_class("lightning_dprobust.methods.dpsgd:DPSGD") is DPSGD
    True
"""

from __future__ import annotations

from typing import TypeVar

_PROJECT_PREFIX = "lightning_dprobust."
_REGISTRY: dict[str, type] = {}

MethodType = TypeVar("MethodType", bound=type)


def qualified_name(cls: type) -> str:
    """``"module:QualName"`` of ``cls``: the name a checkpoint records and the registry's key."""
    return f"{cls.__module__}:{cls.__qualname__}"


def add_method(cls: MethodType) -> MethodType:
    """Files ``cls`` under :func:`qualified_name` (:func:`~lightning_dprobust.methods.base.register_method` checks
    that it is a method first). Returns ``cls``; filing the same class twice is a no-op.

    Raises:
        ValueError: another class is already registered under the same ``"module:QualName"``.
    """
    name = qualified_name(cls)
    if _REGISTRY.get(name, cls) is not cls:
        raise ValueError(f"another class is already registered as {name!r}: give your method a distinct name")
    _REGISTRY[name] = cls
    return cls


def register_project_method(cls: type) -> None:
    """Registers ``cls`` if it is defined inside ``lightning_dprobust`` (called by ``ClassifierModule``)."""
    if cls.__module__.startswith(_PROJECT_PREFIX) and "<locals>" not in cls.__qualname__:
        _REGISTRY[qualified_name(cls)] = cls


def registered_methods() -> tuple[str, ...]:
    """The registered ``"module:QualName"`` names, sorted."""
    return tuple(sorted(_REGISTRY))


def method_class(name: object, source: str = "the checkpoint") -> type:
    """The registered method class called ``name``; nothing is imported other than the project's own methods.

    Raises:
        ValueError: ``name`` is not a string or is not registered; the message lists the registered names and
            says how to register a class of one's own.
    """
    cls = _REGISTRY.get(name) if isinstance(name, str) else None
    if cls is None:
        raise ValueError(
            f"{source} names the class {name!r}, which is not a registered lightning-dprobust method; refusing to "
            f"load it (a checkpoint never imports a module). Registered: {', '.join(sorted(_REGISTRY))}. For a "
            "method of your own, import it and decorate it with lightning_dprobust.methods.register_method"
        )
    return cls


__all__ = ["add_method", "method_class", "qualified_name", "registered_methods"]
