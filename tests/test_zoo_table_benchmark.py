"""benchmarks/zoo_table.py: the shipped zoo entries' table (docs/zoo.md) is the catalog's record, so a catalog change
(an entry rebuilt, a metric re-measured) that leaves the committed result file behind fails here."""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_committed_zoo_table_is_what_the_catalog_records():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        from zoo_table import rows
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    committed = json.loads((ROOT / "results" / "zoo_shipped_classifiers.json").read_text())
    assert committed["rows"] == rows()
