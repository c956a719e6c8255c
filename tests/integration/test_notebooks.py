"""The analysis notebooks run top to bottom on the bundled data, in a real Jupyter kernel."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from tests.support.paths import ROOT

NOTEBOOKS = ROOT / "notebooks"


@pytest.mark.parametrize("name", ["detection_latency.ipynb", "tuning.ipynb"])
def test_notebook_runs_top_to_bottom(name: str, tmp_path: Path):
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    assert not any(cell.get("outputs") for cell in nb.cells if cell.cell_type == "code"), "commit notebooks clean"
    NotebookClient(nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(NOTEBOOKS)}}).execute()
    nbformat.write(nb, tmp_path / name)  # the executed copy, for a look when a test fails
    outputs = [o for cell in nb.cells if cell.cell_type == "code" for o in cell.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    images = [o for o in outputs if "image/png" in o.get("data", {})]
    assert len(images) >= (5 if name == "detection_latency.ipynb" else 2)
