"""What users install: one import root beside Hugging Face's ``datasets``, and a probe without Bytewax.

Both wheels are built from this checkout and installed into fresh virtual environments (no
editable install, no repository on ``sys.path``), as a training image or a server would.
"""

from __future__ import annotations

import json
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

from tests.support.paths import ROOT

pytestmark = pytest.mark.slow


def _run(args: list[str], cwd: Path, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=600)
    if check and done.returncode != 0:
        raise AssertionError(f"{args[:4]} failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return done


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("wheels")
    _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out), ".", "./probe"], cwd=ROOT)
    return {"main": next(out.glob("trainguard-*.whl")), "probe": next(out.glob("trainguard_probe-*.whl"))}


def _new_env(path: Path) -> Path:
    venv.create(path, with_pip=True)
    return path / "bin" / "python"


def _tops(wheel: Path) -> set[str]:
    return {name.split("/")[0] for name in zipfile.ZipFile(wheel).namelist() if ".dist-info/" not in name}


def test_the_wheel_installs_only_trainguard_and_its_data(wheels: dict[str, Path]) -> None:
    names = zipfile.ZipFile(wheels["main"]).namelist()
    assert _tops(wheels["main"]) == {"trainguard"}
    assert not any(n.startswith("trainguard/__init__") for n in names)  # a namespace shared with the probe
    data = ("detectors/data/xid-catalog.csv", "datasets/samples/demo/logs.parquet", "console/static/app.js")
    assert {f"trainguard/{path}" for path in data} <= set(names)
    # The probe wheel: its package and the deprecated alias, which is a namespace portion.
    assert _tops(wheels["probe"]) == {"trainguard", "dataflows"}
    assert "dataflows/__init__.py" not in zipfile.ZipFile(wheels["probe"]).namelist()


def test_beside_hugging_face_datasets(wheels: dict[str, Path], tmp_path: Path) -> None:
    python = _new_env(tmp_path / "env")
    _run([str(python), "-m", "pip", "install", "-q", str(wheels["main"]), str(wheels["probe"]), "datasets"], tmp_path)
    check = (
        "import json, datasets, trainguard.datasets.generator as ours, trainguard.detectors.xid as xid;"
        "print(json.dumps([datasets.__file__, hasattr(datasets, 'load_dataset'), ours.__file__, len(xid.catalog())]))"
    )
    theirs, is_hf, ours, codes = json.loads(_run([str(python), "-c", check], tmp_path).stdout)
    assert theirs.endswith("site-packages/datasets/__init__.py") and is_hf
    assert ours.endswith("site-packages/trainguard/datasets/generator.py")
    assert codes == 172  # the vendored catalog travelled with the wheel
    # The main job runs from the installed wheel (the bundled scenario is package data).
    demo = _run([str(tmp_path / "env" / "bin" / "trainguard"), "demo", "--out", str(tmp_path / "out")], tmp_path)
    assert "Found 4 of the 4 labelled faults" in demo.stdout
    # Uninstalling Hugging Face's package leaves ours whole, and no longer answers `import datasets`.
    _run([str(python), "-m", "pip", "uninstall", "-q", "-y", "datasets"], tmp_path)
    _run([str(python), "-c", "import trainguard.datasets.generator"], tmp_path)
    assert _run([str(python), "-c", "import datasets"], tmp_path, check=False).returncode != 0


def test_the_probe_alone_needs_no_bytewax(wheels: dict[str, Path], tmp_path: Path) -> None:
    python = _new_env(tmp_path / "env")
    _run([str(python), "-m", "pip", "install", "-q", str(wheels["probe"])], tmp_path)
    script = f"""
import importlib.util, json, warnings
from trainguard.probe import ProgressProbe
probe = ProgressProbe(job_id="7", node="n1", rank=0, path={str(tmp_path / "p.jsonl")!r})
probe.step(1, step_time_s=1.0)
probe.close()
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    from dataflows.probe import ProgressProbe as Old
print(json.dumps([
    [importlib.util.find_spec(m) is not None for m in ("bytewax", "polars", "starlette", "msgspec")],
    Old is ProgressProbe,
    [str(w.category.__name__) for w in caught],
]))
"""
    found, same, warned = json.loads(_run([str(python), "-c", script], tmp_path).stdout)
    assert found == [False, False, False, True]
    assert same and "DeprecationWarning" in warned
    assert json.loads((tmp_path / "p.jsonl").read_text())["job_id"] == "7"
