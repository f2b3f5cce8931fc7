"""benchmarks/zoo_table.py: the zoo tables of docs/zoo.md, docs/methods/stobatch.md and docs/methods/ain.md are the
catalog's record, so a catalog change (an entry rebuilt, a metric re-measured) that leaves a committed result file
behind fails here."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(("method", "name"), [(None, "zoo_shipped_classifiers"), ("StoBatch", "zoo_stobatch"),
                                              ("AIN", "zoo_ain")])  # fmt: skip
def test_each_committed_zoo_table_is_what_the_catalog_records(method, name):
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        from zoo_table import rows
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    committed = json.loads((ROOT / "results" / f"{name}.json").read_text())
    assert committed["rows"] == rows(method)
