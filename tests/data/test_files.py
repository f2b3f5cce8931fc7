"""Messages and integrity checks of :class:`DatasetSource`."""

from __future__ import annotations

import hashlib

import pytest

from lightning_dprobust.data import DatasetNotFoundError
from lightning_dprobust.data.files import DatasetSource, list_names

SOURCE = DatasetSource(title="Toy", name="toy", url="https://example.org/toy", layout="{root}/a.bin and {root}/b.bin")


def test_list_names_counts_what_it_leaves_out():
    assert list_names(["a", "b"]) == "a, b"
    assert list_names([str(k) for k in range(12)], limit=3) == "0, 1, 2 and 9 more"


def test_missing_error_names_files_folder_url_and_settings(tmp_path):
    with pytest.raises(DatasetNotFoundError) as error:
        SOURCE.require(tmp_path, ["a.bin", "b.bin"])
    message = str(error.value)
    for expected in ("missing a.bin, b.bin", f"{tmp_path}/a.bin and {tmp_path}/b.bin", "https://example.org/toy"):
        assert expected in message
    assert "--data.data_dir" in message and "DPROBUST_DATA" in message and "$DPROBUST_DATA/toy" in message
    assert "--data.download" not in message
    assert isinstance(error.value, FileNotFoundError)


def test_require_md5_accepts_the_right_sum_and_names_a_wrong_one(tmp_path):
    (tmp_path / "a.bin").write_bytes(b"hello")
    SOURCE.require_md5(tmp_path, [("a.bin", hashlib.md5(b"hello").hexdigest())])
    with pytest.raises(DatasetNotFoundError, match=r"a\.bin .*corrupt.*MD5 sum differs from the published 0123"):
        SOURCE.require_md5(tmp_path, [("a.bin", "0123")])
    with pytest.raises(DatasetNotFoundError, match="missing b.bin"):
        SOURCE.require_md5(tmp_path, [("a.bin", "0123"), ("b.bin", "4567")])
