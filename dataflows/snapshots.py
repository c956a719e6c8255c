"""Restoring the flow's pickled state, including state written before the one import root.

Up to 0.1 the packages were installed as ``dataflows``, ``detectors``, ``actions`` and
``datasets``, so a recovery snapshot of that release names classes such as
``detectors.monitor.JobMonitor``. :func:`restore` reads those names as their ``trainguard.…``
modules, without putting the old names back into ``sys.modules`` (``datasets`` is Hugging
Face's).

>>> import pickle
>>> from trainguard.detectors.settings import HangSettings
>>> restore(pickle.dumps(HangSettings(floor_s=42.0))).floor_s
42.0
>>> old = pickle.dumps(HangSettings(), protocol=0).replace(b"trainguard.detectors.settings", b"detectors.settings")
>>> type(restore(old)).__module__
'trainguard.detectors.settings'
"""

from __future__ import annotations

import io
import pickle
from typing import Any

__all__ = ["restore"]

_FORMER_ROOTS = frozenset({"dataflows", "detectors", "actions", "datasets"})
# Classes that moved between modules since (the contract's Action went to the actions package).
_MOVED = {("trainguard.detectors.events", "Action"): ("trainguard.actions.records", "Action")}


class _Unpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if module.partition(".")[0] in _FORMER_ROOTS:
            module = f"trainguard.{module}"
        module, name = _MOVED.get((module, name), (module, name))
        return super().find_class(module, name)


def restore(data: bytes) -> Any:
    """Unpickle one snapshot, mapping module paths of releases before 0.2 to ``trainguard.…``."""
    return _Unpickler(io.BytesIO(data)).load()
