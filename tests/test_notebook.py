"""The quickstart notebook runs end to end (small settings) and fails the suite on any error."""

from __future__ import annotations

from pathlib import Path

import nbformat
from nbclient import NotebookClient

NOTEBOOK = Path(__file__).resolve().parents[1] / "notebooks" / "quickstart.ipynb"


def test_quickstart_notebook_executes(tmp_path, monkeypatch):
    monkeypatch.setenv("DPROBUST_QUICK", "1")
    monkeypatch.setenv("WANDB_MODE", "offline")
    (tmp_path / "runs" / "quickstart").mkdir(parents=True)
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    NotebookClient(
        notebook, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    ).execute()
    outputs = "".join(
        output.get("text", "") for cell in notebook.cells if cell.cell_type == "code" for output in cell.outputs
    )
    assert "DP-SGD: epsilon" in outputs and "DP-CERT: clean" in outputs
    assert (tmp_path / "runs" / "quickstart" / "certified_accuracy.png").stat().st_size > 1000
    shown = [output for cell in notebook.cells if cell.cell_type == "code" for output in cell.outputs
             if "image/png" in output.get("data", {})]  # fmt: skip
    assert shown, "the certified-accuracy plot must be shown inline"
    source = "".join(cell.source for cell in notebook.cells)
    assert 'matplotlib.use("Agg")' not in source and 'filterwarnings("ignore")' not in source
