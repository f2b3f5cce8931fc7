"""Every paper reproduction kit (``benchmarks/papers/``) runs its whole grid in smoke mode (fake data in the real file
formats, tiny models, 2 steps per cell) and writes one result file per cell and a table with every cell of the grid."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

PAPERS = Path(__file__).resolve().parent.parent / "benchmarks" / "papers"
KITS = ("dpcert", "dpadv", "stobatch", "residual", "thesis")


def load_kit(name: str):
    """A kit module (``benchmarks/papers/<name>.py``) under a private name; ``paperkit`` as the kits import it."""
    if str(PAPERS) not in sys.path:
        sys.path.insert(0, str(PAPERS))
    if name == "paperkit":
        return importlib.import_module("paperkit")
    module_name = f"paper_kit_{name}"
    if module_name not in sys.modules:
        spec = importlib.util.spec_from_file_location(module_name, PAPERS / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module  # dataclasses look their module up there
        spec.loader.exec_module(module)
    return sys.modules[module_name]


PARTS = [(name, index) for name in KITS for index in range(3 if name == "thesis" else 1)]
"""The thesis kit holds three tables (IGAMT, AIN, TransDenoiser), one test each."""


@pytest.mark.parametrize(("name", "part"), PARTS, ids=[f"{n}-{i}" for n, i in PARTS])
def test_smoke_mode_writes_every_cell_of_the_grid(name, part, tmp_path):
    module = load_kit(name)
    kit = getattr(module, "KITS", (getattr(module, "KIT", None),))[part]
    table = load_kit("paperkit").run_kit(kit, smoke=True, out=tmp_path)
    text = table.read_text()
    keys = [cell.key for cell in kit.cells]
    assert len(keys) == len(set(keys)), "cell keys must be unique"
    record = json.loads((tmp_path / f"{kit.name}.json").read_text())
    assert len(record["rows"]) == len(kit.cells)
    for cell, row in zip(kit.cells, record["rows"], strict=True):
        assert row[: len(cell.labels)] == list(cell.labels)
        assert "| " + " | ".join(cell.labels) + " |" in text
        if cell.skip:
            assert f"not run: {cell.skip}" in row[len(cell.labels)]
            continue
        path = tmp_path / f"{kit.name}__{load_kit('paperkit').slug(cell.key)}.json"
        result = json.loads(path.read_text())
        assert result["seeds"] == [0] and "SMOKE" in result["notes"]
        measured = [r[1] for r in result["rows"] if r[0] != "seconds (this run)"]
        assert any(value != "-" for value in measured), (cell.key, result["rows"])
    assert any(cell.paper for cell in kit.cells) or "no numbers" in kit.source, "the table carries the paper's numbers"


def test_paper_kits_state_their_gpu_time():
    for name in KITS:
        doc = load_kit(name).__doc__
        assert "GPU" in doc and "estimate" in doc.lower(), name


def test_the_smoke_timer_counts_every_cell_of_a_kits_grid():
    """``benchmarks/paper_kit_times.py`` reports each kit's grid size from ``--list``: every cell, run or listed."""
    sys.path.insert(0, str(PAPERS.parent))
    try:
        from paper_kit_times import cell_count
    finally:
        sys.path.remove(str(PAPERS.parent))
    kits = load_kit("thesis").KITS
    assert cell_count("thesis") == sum(len(kit.cells) for kit in kits)


def test_the_gpu_estimate_of_one_cell_is_its_steps_times_its_timed_step_over_the_assumed_speedup(tmp_path):
    """``--estimate``'s arithmetic on one real recipe (DP-Adv's MNIST SGD cell, timed on this CPU): the cell's row and
    the total over the seeds."""
    paperkit, kit = load_kit("paperkit"), load_kit("dpadv").KIT
    cell = next(cell for cell in kit.cells if cell.key == "mnist_SGD_epsinf")
    rows, total = paperkit.estimate_rows(kit, seeds=3, only=["mnist_SGD_epsinf"])
    assert len(rows) == 1 and rows[0][:2] == [", ".join(cell.labels), str(cell.real_steps)]
    per_step = float(rows[0][2])
    assert per_step > 0
    hours = cell.real_steps * per_step / paperkit.GPU_SPEEDUP / 3600
    assert float(rows[0][3]) == pytest.approx(hours, abs=0.006)
    rounding = cell.real_steps * 0.0005 / paperkit.GPU_SPEEDUP / 3600  # the printed step time has 3 decimals
    assert total == pytest.approx(3 * hours, abs=3 * rounding + 1e-12)


def test_only_the_transdenoiser_rows_that_transform_the_noise_share_their_timing():
    """The transforming rows compute per-example input Jacobians (minutes a step on CPU); _nodp and _sepdp do not, so
    an estimate that reused the transforming rows' step time for them would overstate theirs many times over."""
    thesis = load_kit("thesis")
    keys = {cell.labels[1]: cell.timing_key for cell in thesis.TD_KIT.cells if cell.labels[0] == "MNIST" and cell.run}
    assert keys["TransDenoiser"] == keys["TransDenoiser_inp_0.1"]
    others = [keys[row] for row in ("TransDenoiser_nodp", "TransDenoiser_sepdp", "public classifier alone")]
    assert len({keys["TransDenoiser"], *others, keys["DP-SGD + smoothing"]}) == 5
