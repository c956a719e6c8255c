"""Doctests import each module by its installed name (``trainguard.detectors.xid``).

The design card's folders (``detectors/``, ``dataflows/``, ``actions/``, ``datasets/``, and
``probe/trainguard/probe``) are installed under one import root; pytest would import their
files by folder name (``detectors.xid``) — a second copy of every module, with its own
Prometheus metrics and classes. The doctest collector is pointed at the installed module.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from types import ModuleType

from _pytest.doctest import DoctestModule

ROOT = Path(__file__).resolve().parent
_INSTALLED = {  # the most specific folder first
    ROOT / "dataflows" / "console": "trainguard.console",
    ROOT / "dataflows" / "agents": "trainguard.agents",
    ROOT / "dataflows" / "cli": "trainguard.cli",
    ROOT / "dataflows": "trainguard.dataflows",
    ROOT / "detectors": "trainguard.detectors",
    ROOT / "actions": "trainguard.actions",
    ROOT / "datasets": "trainguard.datasets",
    ROOT / "probe" / "trainguard" / "probe": "trainguard.probe",
}
# The deprecated alias warns on import (tests/integration/test_packaging.py checks it in an installed wheel).
collect_ignore = ["probe/dataflows"]


def installed_name(path: Path) -> str | None:
    """``trainguard.detectors.xid`` for ``detectors/xid.py``; ``None`` outside the packages."""
    for folder, package in _INSTALLED.items():
        if path.is_relative_to(folder):
            parts = path.relative_to(folder).with_suffix("").parts
            parts = parts[:-1] if parts[-1] == "__init__" else parts
            return ".".join((package, *parts))
    return None


_import_by_path = DoctestModule._getobj


def _import_installed(self: DoctestModule) -> ModuleType:
    name = installed_name(Path(self.path))
    return importlib.import_module(name) if name else _import_by_path(self)


DoctestModule._getobj = _import_installed  # type: ignore[method-assign]
