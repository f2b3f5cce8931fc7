"""Checkpoint zoo: trained models with their privacy, robustness and training provenance.

The catalog is the top-level ``zoo/`` directory: one YAML file per entry in ``zoo/entries/`` and the shipped weights
in ``zoo/weights/``. Names follow timm's ``arch.tag`` convention (Wightman 2019,
https://github.com/huggingface/pytorch-image-models), e.g. ``cnn_tanh.dpsgd_digits_eps3``; an entry carries, like
torchvision's weights API (Marcel and Rodriguez 2010, https://github.com/pytorch/vision), where its file is, how
inputs must look and a ``meta`` block: dataset, parameter count, metrics, the DP guarantee, the smoothing noise and
the recipe (config + commit) that reproduces it. Entries with ``status: recipe`` publish no weights: they name the
config that trains them and the paper's numbers as a target (``dprobust zoo build NAME``).

Weights are fetched from ``$DPROBUST_ZOO_URL`` (default: this repository's ``zoo/`` directory as a ``file://`` URL,
so shipped entries work offline; point the variable at a web mirror of that directory to serve them over HTTP) into
the cache ``$DPROBUST_HOME/zoo`` (default ``~/.cache/dprobust/zoo``).

Guarantees: a file is used only after its SHA-256 matches the catalog; a download is written to a temporary file in
the cache and moved into place atomically, so an interrupted or corrupt transfer never leaves a file under the
final name; a cached file is re-hashed, never re-downloaded; weights are read with ``torch.load(weights_only=True)``
(or safetensors), so a checkpoint is never executed.

Example:
    >>> from lightning_dprobust import zoo
    >>> entry = zoo.info("cnn_tanh.dpsgd_mnist_eps1")
    >>> entry.status, entry.meta["target_metrics"]["test_acc"]
    ('recipe', 0.972)
"""

from __future__ import annotations

import contextlib
import difflib
import fnmatch
import hashlib
import http.client
import os
import pickle
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # torch is imported where weights are read: listing the catalog needs none
    import torch
    from torch import nn

import yaml

from lightning_dprobust.paths import shipped_root
from lightning_dprobust.zoo.catalog import (
    CatalogError,
    ChecksumError,
    DownloadError,
    Entry,
    NotShippedError,
    UnknownEntryError,
    UnsafeCheckpointError,
    catalog_error,
)

ZOO_DIR = shipped_root() / "zoo"
"""The catalog shipped with the code: ``entries/*.yaml`` and ``weights/``."""
HOME_ENV = "DPROBUST_HOME"
URL_ENV = "DPROBUST_ZOO_URL"
_CHUNK = 1 << 16
_TIMEOUT_S = 60.0
"""Seconds a single read may wait, and the most a chunk of ``_CHUNK`` bytes may take to arrive (a mirror that drips
a byte at a time is abandoned after this long, not after :data:`DEADLINE_S`)."""
DEADLINE_S = 900.0
"""Seconds a whole download may take."""
_BYTES_PER_PARAM, _SLACK_BYTES = 8, 1 << 20
"""Size cap of an entry's weights: 8 bytes per parameter (float64 at most) plus 1 MiB of buffers and container."""


def default_cache_dir() -> Path:
    """``$DPROBUST_HOME/zoo``, else ``$XDG_CACHE_HOME/dprobust/zoo``, else ``~/.cache/dprobust/zoo``."""
    home = os.environ.get(HOME_ENV)
    if home:
        return Path(home).expanduser() / "zoo"
    cache = os.environ.get("XDG_CACHE_HOME")
    return (Path(cache).expanduser() if cache else Path.home() / ".cache") / "dprobust" / "zoo"


def default_base_url() -> str:
    """``$DPROBUST_ZOO_URL``, else the shipped ``zoo/`` directory as a ``file://`` URL (always ending in ``/``)."""
    url = os.environ.get(URL_ENV) or ZOO_DIR.as_uri()
    return url if url.endswith("/") else url + "/"


def sha256_file(path: str | os.PathLike) -> str:
    """Hex SHA-256 of a file, read in chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as stream:
        while chunk := stream.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


class Zoo:
    """A catalog directory, the base URL its weights are served from, and a local cache.

    The module-level functions (:func:`list_entries`, :func:`info`, :func:`download`, :func:`load`) use a ``Zoo``
    built from the environment at each call; build one directly to use another catalog or mirror.

    Args:
        catalog_dir: directory holding ``entries/*.yaml`` (default: the shipped ``zoo/``).
        base_url: URL the entries' relative ``url`` is joined to (default :func:`default_base_url`).
        cache_dir: where downloaded weights are kept (default :func:`default_cache_dir`).
    """

    def __init__(
        self,
        catalog_dir: str | os.PathLike | None = None,
        base_url: str | None = None,
        cache_dir: str | os.PathLike | None = None,
    ) -> None:
        self.catalog_dir = Path(catalog_dir) if catalog_dir is not None else ZOO_DIR
        url = base_url or default_base_url()
        self.base_url = url if url.endswith("/") else url + "/"
        self.cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()

    def entries(self) -> dict[str, Entry]:
        """Every entry of the catalog by name, validated; raises :class:`CatalogError` naming a bad file."""
        found: dict[str, Entry] = {}
        for path in sorted((self.catalog_dir / "entries").glob("*.yaml")):
            entry = Entry.from_dict(yaml.safe_load(path.read_text()), str(path))
            if path.stem != entry.name:
                raise catalog_error(str(path), f"the file must be named after its entry: {entry.name}.yaml")
            found[entry.name] = entry
        return found

    def list_entries(self, pattern: str = "*") -> list[Entry]:
        """Entries whose name matches the shell pattern ``pattern``, sorted by name."""
        return [entry for name, entry in sorted(self.entries().items()) if fnmatch.fnmatchcase(name, pattern)]

    def info(self, name: str) -> Entry:
        """The entry called ``name``; raises :class:`UnknownEntryError` listing close matches."""
        entries = self.entries()
        if name not in entries:
            matches = difflib.get_close_matches(name, entries, n=5, cutoff=0.5)
            hint = f" Did you mean: {', '.join(matches)}?" if matches else ""
            raise UnknownEntryError(f"unknown zoo entry {name!r}.{hint} See all entries with `dprobust zoo list`.")
        return entries[name]

    def download(self, name: str, *, force: bool = False) -> Path:
        """Path of the entry's verified weights in the cache, fetched only when missing (or when ``force``).

        Raises:
            NotShippedError: for a recipe entry (the message says how to build it).
            DownloadError: if the transfer fails or ends early.
            ChecksumError: if the downloaded or cached file does not match the catalog's SHA-256.
        """
        entry = self.info(name)
        if not entry.shipped:
            raise NotShippedError(
                f"zoo entry {name!r} is recipe-only: no weights are published. Train it from its recipe "
                f"({entry.meta['recipe']['config']}) with `dprobust zoo build {name}`."
            )
        target = self.cache_dir / entry.file
        if target.is_file() and not force:
            if sha256_file(target) != entry.sha256:
                raise ChecksumError(
                    f"cached weights {target} do not match the catalog's sha256 {entry.sha256}: delete the file or "
                    f"download again with zoo.download({name!r}, force=True) / `dprobust zoo download {name} --force`"
                )
            return target
        _fetch(urllib.parse.urljoin(self.base_url, entry.url), target, entry.sha256, max_download_bytes(entry))
        return target

    def load(self, name: str) -> nn.Module:
        """The entry's model with its verified weights, on CPU in eval mode (inputs: images in ``[0, 1]``).

        A denoiser entry comes back in front of its classifier (``meta.classifier``): ``h(g(x))``, ready to certify;
        an attack entry comes back as its bare AIN generator (``AINAttack`` wraps it).

        Raises:
            UnsafeCheckpointError: if the file holds anything but a flat ``{name: tensor}`` state dict.
            CatalogError: if the state dict does not fit the entry's model.
        """
        entry = self.info(name)
        state = read_state_dict(self.download(name))
        model = entry.build_model()
        fit_state_dict(model, state, f"the weights of {name!r} do not fit its model {entry.model['name']}")
        if entry.kind == "denoiser":
            from lightning_dprobust.models.denoised import DenoisedClassifier

            return DenoisedClassifier(self.load(entry.meta["classifier"]), model).eval()
        if entry.kind == "attack":  # an AIN generator takes (images, labels): no normalization layer in front
            return model.net.eval()
        return model.eval()


def max_download_bytes(entry: Entry) -> int | None:
    """The most bytes the weights of ``entry`` can take (from its ``meta.num_params``), ``None`` if unknown."""
    params = entry.meta.get("num_params")
    return None if not params else _BYTES_PER_PARAM * int(params) + _SLACK_BYTES


def _fetch(url: str, target: Path, sha256: str, max_bytes: int | None = None) -> None:
    """Download ``url`` to ``target`` through a temporary file that is hashed, then moved into place atomically."""
    target.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_parts(target)
    handle, partial = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".part", dir=target.parent)
    try:
        with os.fdopen(handle, "wb") as stream:
            digest = _copy(url, stream, max_bytes, time.monotonic() + DEADLINE_S)
        if digest != sha256:
            raise ChecksumError(
                f"{url} has sha256 {digest}, but the catalog expects {sha256}: the file is corrupt or was replaced "
                f"on the server; nothing was cached. Check ${URL_ENV} or report the mirror"
            )
        os.replace(partial, target)
    finally:
        Path(partial).unlink(missing_ok=True)


def _remove_stale_parts(target: Path) -> None:
    """Delete the ``.part`` files an earlier download of ``target`` left when it was killed (SIGKILL, power loss:
    no ``finally`` ran) and that no download can still be writing (older than :data:`DEADLINE_S`)."""
    for part in target.parent.glob(f".{target.name}.*.part"):
        with contextlib.suppress(OSError):
            if time.time() - part.stat().st_mtime > DEADLINE_S:
                part.unlink()


def _copy(url: str, stream: Any, max_bytes: int | None, deadline: float) -> str:
    """Stream ``url`` into ``stream`` with a progress bar (on a terminal); return the hex SHA-256 of what was received.

    A body announced or found larger than ``max_bytes`` is refused as soon as that is known, and a transfer still
    running at ``deadline`` (``time.monotonic()``) is abandoned: both raise ``DownloadError``, as do network errors.
    """
    from tqdm.auto import tqdm

    digest, received, expected = hashlib.sha256(), 0, None
    try:
        with urllib.request.urlopen(url, timeout=_TIMEOUT_S) as response:
            expected = response.headers.get("Content-Length")
            _check_size(url, int(expected) if expected is not None else 0, max_bytes)
            total = int(expected) if expected is not None else None
            read = getattr(response, "read1", response.read)  # read1: what has arrived, never waits to fill a chunk
            with tqdm(total=total, unit="B", unit_scale=True, desc=Path(url).name, disable=None, leave=False) as bar:
                chunk_started, chunk_bytes = time.monotonic(), 0
                while chunk := read(_CHUNK):
                    received += len(chunk)
                    chunk_bytes += len(chunk)
                    _check_size(url, received, max_bytes)
                    now = time.monotonic()
                    if now > deadline:
                        raise DownloadError(
                            f"downloading {url} did not finish within {DEADLINE_S:g} s ({received} bytes came); "
                            f"nothing was cached. Try again on a faster connection, or set ${URL_ENV} to a nearer one"
                        )
                    if chunk_bytes >= _CHUNK:
                        chunk_started, chunk_bytes = now, 0
                    elif now - chunk_started > _TIMEOUT_S:
                        raise DownloadError(
                            f"downloading {url} stalled: fewer than {_CHUNK} bytes in {_TIMEOUT_S:g} s ({received} "
                            f"bytes came in all); nothing was cached. Try again, or set ${URL_ENV} to another mirror"
                        )
                    digest.update(chunk)
                    stream.write(chunk)
                    bar.update(len(chunk))
    except (OSError, http.client.HTTPException) as error:
        raise DownloadError(
            f"downloading {url} failed after {received} bytes ({type(error).__name__}: {error}); nothing was cached. "
            f"Check the network, or set ${URL_ENV} to a reachable mirror of the zoo directory"
        ) from error
    if expected is not None and received != int(expected):
        raise DownloadError(
            f"downloading {url} ended after {received} of {expected} bytes; nothing was cached. Try again"
        )
    return digest.hexdigest()


def _check_size(url: str, size: int, max_bytes: int | None) -> None:
    if max_bytes is not None and size > max_bytes:
        raise DownloadError(
            f"{url} is larger than the {max_bytes} bytes its entry's model can take ({size} bytes announced or "
            f"received); nothing was cached. The server does not serve this entry's weights: check ${URL_ENV}"
        )


def read_state_dict(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """Read a flat ``{name: tensor}`` state dict without executing anything.

    ``.safetensors`` files are read with safetensors; anything else with ``torch.load(weights_only=True)``, whose
    restricted unpickler accepts only tensors and plain containers.

    Raises:
        UnsafeCheckpointError: if the file needs arbitrary unpickling (classes, functions: code) or does not hold
            a flat mapping of names to tensors.
    """
    import torch

    path = Path(path)
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        state: Any = load_file(str(path))
    else:
        try:
            state = torch.load(path, map_location="cpu", weights_only=True)
        except pickle.UnpicklingError as error:
            raise UnsafeCheckpointError(
                f"refusing to load {path}: it contains pickled objects beyond plain tensors (possibly code), which "
                "torch.load(weights_only=True) does not execute. Zoo weights must be a model state_dict saved with "
                "torch.save(model.state_dict(), ...)"
            ) from error
    if not isinstance(state, dict) or not all(
        isinstance(key, str) and isinstance(value, torch.Tensor) for key, value in state.items()
    ):
        raise UnsafeCheckpointError(
            f"refusing to load {path}: expected a flat {{name: tensor}} state dict, got {type(state).__name__}; "
            "save weights with torch.save(model.state_dict(), ...)"
        )
    return state


def fit_state_dict(model: nn.Module, state: dict[str, torch.Tensor], problem: str) -> None:
    """Load ``state`` into ``model`` exactly (same keys, same shapes); otherwise raise :class:`CatalogError`.

    Args:
        problem: the start of the error message, saying what did not fit what.
    """
    try:
        missing, unexpected = model.load_state_dict(state, strict=False)
    except RuntimeError as error:
        raise CatalogError(f"{problem}: {error}; the entry's model kwargs and the weights disagree") from error
    if missing or unexpected:
        raise CatalogError(
            f"{problem}: missing {missing}, unexpected {unexpected}; the entry's model kwargs and the weights disagree"
        )


def list_entries(pattern: str = "*") -> list[Entry]:
    """Catalog entries whose name matches the shell pattern, sorted (also available as ``zoo.list``)."""
    return Zoo().list_entries(pattern)


def info(name: str) -> Entry:
    """The catalog entry ``name``; raises :class:`UnknownEntryError` with close matches."""
    return Zoo().info(name)


def download(name: str, *, force: bool = False) -> Path:
    """Path of the verified, cached weights of ``name`` (see :meth:`Zoo.download`)."""
    return Zoo().download(name, force=force)


def load(name: str) -> nn.Module:
    """The model of ``name`` with its verified weights, in eval mode (see :meth:`Zoo.load`).

    Example:
        >>> import torch
        >>> from lightning_dprobust import zoo
        >>> model = zoo.load("mlp_tanh.dpsgd_digits_eps3")
        >>> model(torch.rand(2, 1, 8, 8)).shape
        torch.Size([2, 10])
    """
    return Zoo().load(name)


__all__ = [
    "ZOO_DIR",
    "Zoo",
    "download",
    "fit_state_dict",
    "info",
    "list_entries",
    "load",
    "read_state_dict",
    "sha256_file",
]
