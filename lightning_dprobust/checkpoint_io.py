"""Crash-safe checkpoint files: atomic and durable writes, safe reads with one clear error per failure.

Lightning's ``TorchCheckpointIO`` (2.6) serializes into memory and writes through an fsspec transaction, whose local
temporary file lies in the system temp folder: when that folder is on another filesystem than the checkpoint (a
``tmpfs`` ``/tmp``, a cluster scratch disk), the final move is a copy that truncates the previous checkpoint first,
so a crash during the copy leaves neither the old nor the new file; and nothing is ``fsync``-ed, so a power loss
soon after a save can leave an empty file. :class:`AtomicCheckpointIO` writes next to the target, ``fsync``-s, then
renames (POSIX ``rename``, ``os.replace`` in Python, is atomic within one filesystem).

Use it as ``Trainer(plugins=[AtomicCheckpointIO()])`` or, in a config, ``trainer.plugins: [{class_path:
lightning_dprobust.checkpoint_io.AtomicCheckpointIO}]``.

Example:
    >>> import tempfile
    >>> path = Path(tempfile.mkdtemp()) / "last.ckpt"
    >>> atomic_save({"step": torch.tensor(3)}, path)
    >>> read_checkpoint(path)["step"].item()
    3
"""

from __future__ import annotations

import os
import pickle
import re
import secrets
import zipfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
from fsspec.implementations.local import LocalFileSystem
from lightning.fabric.utilities.cloud_io import get_filesystem
from lightning.fabric.utilities.types import _PATH
from lightning.pytorch.plugins.io import TorchCheckpointIO
from torch import nn
from typing_extensions import override

_UNSUPPORTED_GLOBAL = re.compile(r"[Uu]nsupported (?:global: )?GLOBAL (\S+)")


class CheckpointError(ValueError):
    """A checkpoint file is truncated, not a checkpoint, unsafe to unpickle, or does not fit the model."""


class AtomicCheckpointIO(TorchCheckpointIO):
    """``TorchCheckpointIO`` whose local saves never leave a partial file under the checkpoint's name.

    Guarantees (local paths): at every instant the checkpoint's path holds either the previous complete file or the
    new complete file, even if the process is killed or the machine loses power mid-save; the new file is on disk
    (``fsync`` of the file and of its folder) when ``save_checkpoint`` returns. A save interrupted by an exception
    removes its temporary file; one interrupted by ``SIGKILL`` or a power loss can leave a hidden
    ``.<name>.<pid>.<random>.tmp`` next to it, which is safe to delete. Reads go through :func:`read_checkpoint`
    (``weights_only=True`` unless the caller passes ``False``), so a damaged or unsafe file raises one
    :class:`CheckpointError` naming the file and the fix. Remote paths (``s3://`` ...) use Lightning's fsspec code.

    Assumptions: the checkpoint's folder is writable (the temporary file is created there) and on a filesystem whose
    ``rename`` is atomic (every POSIX local filesystem; not guaranteed on some network filesystems).
    """

    @override
    def save_checkpoint(self, checkpoint: dict[str, Any], path: _PATH, storage_options: Any | None = None) -> None:
        if not _is_local(path):
            super().save_checkpoint(checkpoint, path, storage_options)
            return
        if storage_options is not None:
            raise TypeError(f"{type(self).__name__}.save_checkpoint does not take storage_options for local files")
        atomic_save(checkpoint, _local_path(path))

    @override
    def load_checkpoint(
        self,
        path: _PATH,
        map_location: Callable | str | torch.device | None = lambda storage, loc: storage,
        weights_only: bool | None = None,
    ) -> dict[str, Any]:
        if not _is_local(path):
            return super().load_checkpoint(path, map_location, weights_only)
        return read_checkpoint(_local_path(path), map_location, weights_only=weights_only is not False)


def atomic_save(obj: Any, path: str | os.PathLike) -> None:
    """``torch.save(obj, path)`` through a temporary file in the same folder, ``fsync``-ed, then renamed onto ``path``.

    Raises:
        Whatever ``torch.save`` or the filesystem raises; ``path`` is then untouched and the temporary file removed.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)  # umask applies, as for open()
    try:
        with os.fdopen(descriptor, "wb") as stream:
            torch.save(obj, stream)
            stream.flush()
            os.fsync(stream.fileno())
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    _fsync_folder(path.parent)


def read_checkpoint(
    path: str | os.PathLike,
    map_location: Callable | str | torch.device | None = "cpu",
    weights_only: bool = True,
) -> dict[str, Any]:
    """Load a checkpoint dictionary without executing code, turning every failure into one clear error.

    Raises:
        FileNotFoundError: ``path`` is not a file.
        CheckpointError: the file is empty, truncated or not a PyTorch checkpoint; it holds pickled objects beyond
            tensors and plain containers (possibly code), which ``weights_only=True`` refuses to build; or it does
            not hold a dictionary.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint {path} does not exist: pass the path of an existing .ckpt file")
    try:
        checkpoint = torch.load(path, map_location=map_location, weights_only=weights_only)
    except PermissionError:
        raise
    except pickle.UnpicklingError as error:
        if not zipfile.is_zipfile(path):
            raise _unreadable(path, error) from error
        found = _UNSUPPORTED_GLOBAL.search(str(error))
        what = f" ({found.group(1)})" if found else ""
        raise CheckpointError(
            f"refusing to load checkpoint {path}: it holds pickled objects beyond tensors and plain containers{what}, "
            "possibly code, which a checkpoint is never allowed to run. Re-save it as a state_dict of tensors, or "
            "load it yourself with torch.load(weights_only=False) only if you trust its origin"
        ) from error
    except Exception as error:  # garbage bytes make the unpickler fail in many ways (EOF, assertion, index, ...)
        raise _unreadable(path, error) from error
    if not isinstance(checkpoint, dict):
        raise CheckpointError(
            f"checkpoint {path} holds a {type(checkpoint).__name__}, not a checkpoint dictionary: pass a .ckpt file "
            "written by `dprobust fit` or Trainer.save_checkpoint"
        )
    return checkpoint


def check_state_dict_fits(module: nn.Module, state_dict: Mapping[str, Any], source: str) -> None:
    """Raise :class:`CheckpointError` unless ``state_dict`` has exactly ``module``'s keys and tensor shapes.

    Args:
        module: the freshly built model the weights are meant for.
        state_dict: the checkpoint's ``state_dict``.
        source: what the weights come from (a path), for the message.
    """
    expected = module.state_dict()
    missing = sorted(set(expected) - set(state_dict))
    unexpected = sorted(set(state_dict) - set(expected))
    resized = [
        f"{key} {tuple(state_dict[key].shape)} vs {tuple(value.shape)}"
        for key, value in expected.items()
        if key in state_dict and isinstance(state_dict[key], torch.Tensor) and state_dict[key].shape != value.shape
    ]
    if missing or unexpected or resized:
        found = {"missing": missing, "unexpected": unexpected, "shape (checkpoint vs model)": resized}
        problems = "; ".join(f"{label}: {_first(items)}" for label, items in found.items() if items)
        raise CheckpointError(
            f"checkpoint {source} was written for another architecture than this {type(module).__name__} "
            f"({problems}): build the model with the checkpoint's own hyper-parameters (model, model_kwargs, "
            "input_shape, num_classes: checkpoint['hyper_parameters']) or pass the checkpoint of this model"
        )


def _first(items: list[str], shown: int = 5) -> str:
    return ", ".join(items[:shown]) + (f" and {len(items) - shown} more" if len(items) > shown else "")


def _unreadable(path: Path, error: BaseException) -> CheckpointError:
    reason = " ".join(str(error).split())[:200] or type(error).__name__
    return CheckpointError(
        f"checkpoint {path} ({path.stat().st_size} bytes) is truncated, damaged or not a PyTorch checkpoint "
        f"({type(error).__name__}: {reason}). It was probably cut off by a crash or an incomplete copy: resume from "
        "an earlier checkpoint of the run (e.g. its epoch=...-step=....ckpt files) or copy the file again"
    )


def _is_local(path: _PATH) -> bool:
    return isinstance(get_filesystem(path), LocalFileSystem)


def _local_path(path: _PATH) -> Path:
    text = str(path)
    return Path(text.removeprefix("file://"))


def _fsync_folder(folder: Path) -> None:
    """Make a rename in ``folder`` durable; folders cannot be opened for ``fsync`` on Windows, where it is skipped."""
    if os.name == "nt":
        return
    descriptor = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


__all__ = ["AtomicCheckpointIO", "CheckpointError", "atomic_save", "check_state_dict_fits", "read_checkpoint"]
