"""The zoo catalog's schema: :class:`Entry`, its validation, and the zoo's error types.

An entry is one YAML file of ``zoo/entries``. Its fields follow torchvision's weights (``url`` + preprocessing +
``meta``; Marcel and Rodriguez 2010, https://github.com/pytorch/vision) with timm's ``arch.tag`` names (Wightman
2019, https://github.com/huggingface/pytorch-image-models), plus the DP guarantee and the recipe that produced it.
"""

from __future__ import annotations

import dataclasses
import re
from typing import TYPE_CHECKING, Any

import yaml

from lightning_dprobust.core.labels import SECRET_LABEL, SEEDED_LABEL

if TYPE_CHECKING:  # the catalog is read without torch (``dprobust zoo list``); models are imported to build one
    from torch import nn

STATUSES = ("shipped", "recipe")
KINDS = ("classifier", "denoiser", "attack", "generator")
"""A denoiser entry's model maps images to images; ``meta.classifier`` names the zoo classifier it was trained for.
An attack entry is a trained AIN generator; ``meta.classifier`` names the zoo classifier it was trained against.
A generator entry's model is an EHR synthesizer's released artifact (``models/ehr_release.py``: G, decoder body and
last layer), its ``model.kwargs`` the artifact's config; its weights are the artifact's state dict."""
_NEEDS_CLASSIFIER = ("denoiser", "attack")
PRIVACY_KEYS = ("epsilon", "delta", "accountant", "noise_multiplier", "max_grad_norm", "sample_rate", "steps")
RANDOMNESS_LABELS = (SECRET_LABEL, SEEDED_LABEL)
"""The values of ``meta.privacy.randomness_mode`` (optional: entries built before it was recorded lack it)."""
ENTRY_KEYS = ("name", "status", "url", "file", "sha256", "model", "preprocessing", "meta")
META_KEYS = ("dataset", "num_params", "method", "paper", "metrics", "privacy", "smoothing", "recipe")
RECIPE_META_KEYS = ("target_metrics", "target_citation")
OPTIONAL_META_KEYS = RECIPE_META_KEYS + ("notes", "robustness", "certification", "classifier")
CERTIFICATION_KEYS = ("n0", "n", "alpha", "skip")
WEIGHT_SUFFIXES = (".pth", ".safetensors")
NAME_PATTERN = re.compile(r"^(?P<arch>[a-z0-9_]+)\.(?P<tag>[a-z0-9_]+)$")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


class ZooError(RuntimeError):
    """Base class of the zoo's errors; each message says what was wrong and how to fix it."""


class CatalogError(ZooError):
    """A catalog entry is malformed."""


class UnknownEntryError(ZooError):
    """No entry has the requested name."""


class NotShippedError(ZooError):
    """The entry is recipe-only: it has no weights to download."""


class DownloadError(ZooError):
    """The transfer failed or was incomplete; nothing was left in the cache."""


class ChecksumError(ZooError):
    """A file's SHA-256 differs from the catalog's; nothing was left in the cache."""


class UnsafeCheckpointError(ZooError):
    """A checkpoint holds something other than plain tensors (e.g. pickled code) and was refused."""


@dataclasses.dataclass(frozen=True)
class Entry:
    """One catalog entry (a YAML file of ``zoo/entries``), validated when read.

    Attributes:
        name: ``arch.tag``; ``arch`` is the model's registry name (without ``timm/`` for timm models).
        status: ``"shipped"`` (weights published) or ``"recipe"`` (build it with ``dprobust zoo build NAME``).
        url: the weights' URL relative to the zoo base URL (``None`` for recipes).
        file: the weights' file name, ``<name>-<first 8 hex digits of sha256><suffix>``.
        sha256: full hex SHA-256 of the weights file.
        model: ``{"name": registry name, "kwargs": {num_classes, input_shape, mean, std, ...}}``.
        preprocessing: what the model expects: ``input_shape``, ``value_range`` ``[0, 1]``, ``normalization:
            model`` (the mean/std standardization is the model's first layer) and the data ``transform``.
        meta: ``dataset``, ``num_params``, ``method``, ``paper``, ``metrics`` (fractions, e.g. ``test_acc``),
            ``privacy`` (``PRIVACY_KEYS``, optionally ``randomness_mode``; ``None`` when not private), ``smoothing``
            (``{"sigma": s}`` or ``None``), ``recipe`` (``config``, ``overrides``, ``config_sha256``, ``commit``) and,
            for recipes,
            ``target_metrics`` with ``target_citation`` (paper numbers, kept after a build); optional ``notes``,
            ``robustness`` (the attack a build evaluates) and ``certification`` (``n0``, ``n``, ``alpha``, ``skip``
            of the build's certification, where they differ from the defaults); for denoisers ``classifier``, the zoo
            entry of the public classifier the denoiser was trained for.
        kind: ``"classifier"`` (default; not written to the YAML), ``"denoiser"``, ``"attack"`` (an AIN generator)
            or ``"generator"`` (an EHR synthesizer).
    """

    name: str
    status: str
    model: dict[str, Any]
    preprocessing: dict[str, Any]
    meta: dict[str, Any]
    url: str | None = None
    file: str | None = None
    sha256: str | None = None
    kind: str = "classifier"

    @property
    def arch(self) -> str:
        """The architecture part of ``arch.tag``."""
        return self.name.split(".", 1)[0]

    @property
    def tag(self) -> str:
        """The weights part of ``arch.tag``."""
        return self.name.split(".", 1)[1]

    @property
    def shipped(self) -> bool:
        """Whether weights are published for this entry."""
        return self.status == "shipped"

    def build_model(self) -> nn.Module:
        """The entry's architecture with fresh weights (see :func:`lightning_dprobust.models.create_model`; a
        generator's is a :class:`~lightning_dprobust.models.ehr_release.ReleasedSynthesizer`)."""
        from lightning_dprobust.models import create_model
        from lightning_dprobust.models.ehr_release import ReleasedSynthesizer

        if self.kind == "generator":
            return ReleasedSynthesizer(self.model["kwargs"])
        return create_model(self.model["name"], **self.model["kwargs"])

    def to_dict(self) -> dict[str, Any]:
        """The entry as plain YAML-able data, keys in catalog order."""
        data = {key: getattr(self, key) for key in ENTRY_KEYS}
        return data if self.kind == "classifier" else {"kind": self.kind, **data}

    def to_yaml(self) -> str:
        """The entry as the YAML text of a catalog file (block style, no anchors)."""
        return yaml.dump(self.to_dict(), Dumper=_PlainDumper, sort_keys=False, default_flow_style=None, width=120)

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "<dict>") -> Entry:
        """Validate ``data`` (as read from ``source``) and return the entry; raises :class:`CatalogError`."""
        _check_entry(data, source)
        return cls(**data)


class _PlainDumper(yaml.SafeDumper):
    """A safe YAML dumper that writes repeated objects in full instead of as anchors and aliases."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def catalog_error(source: str, problem: str) -> CatalogError:
    """A :class:`CatalogError` for the entry read from ``source``."""
    return CatalogError(f"zoo catalog entry {source}: {problem}")


def _check_entry(data: Any, source: str) -> None:
    if not isinstance(data, dict) or set(data) - {"kind"} != set(ENTRY_KEYS):
        found = sorted(data) if isinstance(data, dict) else type(data).__name__
        raise catalog_error(source, f"needs exactly the keys {list(ENTRY_KEYS)} (and optionally kind), found {found}")
    _check_kind(data, source)
    name, status, model = data["name"], data["status"], data["model"]
    if not isinstance(name, str) or not NAME_PATTERN.match(name):
        raise catalog_error(
            source, f"name {name!r} must be 'arch.tag' in lower case, e.g. 'cnn_tanh.dpsgd_digits_eps3'"
        )
    if status not in STATUSES:
        raise catalog_error(source, f"status {status!r} must be one of {STATUSES}")
    arch = name.split(".")[0]
    if not isinstance(model, dict) or set(model) != {"name", "kwargs"} or model["name"] not in (arch, "timm/" + arch):
        raise catalog_error(
            source, f"model must be {{name: {arch} or timm/{arch}, kwargs: {{num_classes, input_shape, ...}}}}"
        )
    _check_meta(data["meta"], status, source)
    if status == "shipped":
        _check_weights(data, source)
    elif any(data[key] is not None for key in ("url", "file", "sha256")):
        raise catalog_error(source, "a recipe entry publishes no weights: set url, file and sha256 to null")


def _check_kind(data: dict[str, Any], source: str) -> None:
    kind = data.get("kind", "classifier")
    if kind not in KINDS:
        raise catalog_error(source, f"kind {kind!r} must be one of {KINDS}")
    classifier = data["meta"].get("classifier") if isinstance(data["meta"], dict) else None
    if (kind in _NEEDS_CLASSIFIER) != isinstance(classifier, str):
        raise catalog_error(
            source, "a denoiser or attack entry needs meta.classifier naming its zoo classifier; others none"
        )


def _check_meta(meta: Any, status: str, source: str) -> None:
    required = META_KEYS + (RECIPE_META_KEYS if status == "recipe" else ())
    permitted = META_KEYS + OPTIONAL_META_KEYS
    if not isinstance(meta, dict) or not set(required) <= set(meta) <= set(permitted):
        found = sorted(meta) if isinstance(meta, dict) else type(meta).__name__
        raise catalog_error(source, f"meta needs the keys {list(required)} and allows {list(permitted)}, found {found}")
    _check_privacy(meta["privacy"], source)
    smoothing = meta["smoothing"]
    if smoothing is not None and (not isinstance(smoothing, dict) or set(smoothing) != {"sigma"}):
        raise catalog_error(source, "meta.smoothing must be null or {sigma: <noise std in pixel units>}")
    robustness = meta.get("robustness")
    if robustness is not None and (not isinstance(robustness, dict) or not {"attack", "eps"} <= set(robustness)):
        raise catalog_error(source, "meta.robustness must be null or {attack: <suite name>, eps: <budget>, ...kwargs}")
    certification = meta.get("certification")
    if certification is not None and (
        not isinstance(certification, dict) or not set(certification) <= set(CERTIFICATION_KEYS)
    ):
        raise catalog_error(
            source, f"meta.certification must be null or a mapping with keys among {list(CERTIFICATION_KEYS)}"
        )
    if not isinstance(meta["metrics"], dict) or (status == "shipped" and not meta["metrics"]):
        raise catalog_error(source, "meta.metrics must be a mapping, with the measured metrics when shipped")
    if not isinstance(meta["recipe"], dict) or not {"config", "commit"} <= set(meta["recipe"]):
        raise catalog_error(source, "meta.recipe needs 'config' (a path under configs/) and 'commit' (git sha or null)")


def _check_privacy(privacy: Any, source: str) -> None:
    """``meta.privacy``: null, or ``PRIVACY_KEYS`` plus optionally ``randomness_mode`` (in ``RANDOMNESS_LABELS``)."""
    if privacy is None:
        return
    if not isinstance(privacy, dict) or set(privacy) - {"randomness_mode"} != set(PRIVACY_KEYS):
        raise catalog_error(
            source,
            f"meta.privacy must be null (not private) or have exactly the keys {list(PRIVACY_KEYS)}, plus optionally "
            "'randomness_mode'",
        )
    if privacy.get("randomness_mode", SECRET_LABEL) not in RANDOMNESS_LABELS:
        raise catalog_error(source, f"meta.privacy.randomness_mode must be one of {list(RANDOMNESS_LABELS)}")


def _check_weights(data: dict[str, Any], source: str) -> None:
    sha, file, url = data["sha256"], data["file"], data["url"]
    if not isinstance(sha, str) or not _SHA256.match(sha):
        raise catalog_error(source, f"sha256 must be 64 lower-case hex digits, got {sha!r}")
    stems = [f"{data['name']}-{sha[:8]}{suffix}" for suffix in WEIGHT_SUFFIXES]
    if file not in stems:
        raise catalog_error(source, f"file {file!r} must be one of {stems} (name, sha256 prefix, suffix)")
    if not isinstance(url, str) or not url.endswith(file):
        raise catalog_error(source, f"url {url!r} must end with the file name {file!r}")


__all__ = [
    "CatalogError",
    "ChecksumError",
    "DownloadError",
    "Entry",
    "NotShippedError",
    "UnknownEntryError",
    "UnsafeCheckpointError",
    "ZooError",
    "catalog_error",
]
