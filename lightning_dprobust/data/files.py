"""File checks shared by the data modules, and the one error they raise when files are missing or damaged.

Every check raises :class:`~lightning_dprobust.data.base.DatasetNotFoundError` with a message that names the
files, the ``data_dir`` that was searched, how to point the module elsewhere (``--data.data_dir`` or
``$DPROBUST_DATA``) and where the official data lives. MD5 sums go through torchvision's
:func:`torchvision.datasets.utils.check_integrity`, looked up at call time so tests can patch it as torchvision's
own test-suite does.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from torchvision.datasets import utils as tv_utils

from lightning_dprobust.data.base import DATA_ENV, DatasetNotFoundError

MAX_LISTED = 8


def list_names(names: Sequence[str], limit: int = MAX_LISTED) -> str:
    """Join ``names`` with commas, listing at most ``limit`` of them and counting the rest."""
    shown = ", ".join(str(name) for name in names[:limit])
    return shown if len(names) <= limit else f"{shown} and {len(names) - limit} more"


@dataclass(frozen=True)
class DatasetSource:
    """Where a dataset's files must lie and where to get them; builds the errors that explain both.

    Args:
        title: the dataset's name as people write it, e.g. ``"CIFAR-10"``.
        name: the data module's ``name``: the default ``data_dir`` is ``$DPROBUST_DATA/<name>``.
        url: where the official files can be downloaded.
        layout: the expected layout under the data directory; ``{root}`` stands for ``data_dir``.
        downloadable: whether the module accepts ``--data.download true``.
    """

    title: str
    name: str
    url: str
    layout: str
    downloadable: bool = False

    def how_to_fix(self, data_dir: Path) -> str:
        """The part of every message that says where the files must be, where to get them and how to set paths."""
        download = " (or pass --data.download true where the network allows it)" if self.downloadable else ""
        return (
            f"Expected layout: {self.layout.format(root=data_dir)}. Get the data from {self.url}{download}, then "
            f"pass --data.data_dir <folder that holds it>, or set {DATA_ENV} to a folder containing "
            f"'{self.name}/' (the default data_dir is ${DATA_ENV}/{self.name})."
        )

    def missing(self, data_dir: Path, names: Sequence[str]) -> DatasetNotFoundError:
        """The error for files (relative to ``data_dir``) that do not exist."""
        return DatasetNotFoundError(
            f"{self.title} not found in data_dir {data_dir}: missing {list_names(names)}. {self.how_to_fix(data_dir)}"
        )

    def corrupt(self, data_dir: Path, path: Path | str, reason: str) -> DatasetNotFoundError:
        """The error for a file or folder that exists but is truncated, damaged or incomplete."""
        return DatasetNotFoundError(
            f"{self.title} file {path} (data_dir {data_dir}) is corrupt or incomplete: {reason}. Delete it and "
            f"get it again. {self.how_to_fix(data_dir)}"
        )

    def incomplete(self, data_dir: Path, reason: str) -> DatasetNotFoundError:
        """The error for a dataset whose files exist but are fewer than the official release."""
        return DatasetNotFoundError(
            f"{self.title} in data_dir {data_dir} is incomplete: {reason}. {self.how_to_fix(data_dir)}"
        )

    def download_failed(self, data_dir: Path, error: BaseException) -> DatasetNotFoundError:
        """The error for a failed download (no network, dead mirror, checksum mismatch)."""
        reason = " ".join(str(error).split())
        return DatasetNotFoundError(
            f"Downloading {self.title} into data_dir {data_dir} failed ({type(error).__name__}: {reason}). "
            f"{self.how_to_fix(data_dir)}"
        )

    def require(self, data_dir: Path, names: Iterable[str]) -> None:
        """Raise one :meth:`missing` error naming every entry of ``names`` absent under ``data_dir``."""
        absent = [name for name in names if not (data_dir / name).exists()]
        if absent:
            raise self.missing(data_dir, absent)

    def require_md5(self, data_dir: Path, files: Iterable[tuple[str, str]]) -> None:
        """Check that each ``(relative path, published md5)`` exists, then that its MD5 sum matches."""
        files = list(files)
        self.require(data_dir, [name for name, _ in files])
        for name, md5 in files:
            if not tv_utils.check_integrity(str(data_dir / name), md5):
                raise self.corrupt(data_dir, data_dir / name, f"its MD5 sum differs from the published {md5}")
