"""The detector protocol: how a detector is fed, told the time, and saved.

A detector sees one key's events (one job's, or one idle node's) in event-time order,
one at a time, and is told when event time moves on; each call returns the
:class:`~trainguard.detectors.findings.Finding` objects it has to report, which the
monitor localises, names and groups into incidents. It does no I/O and knows nothing
of Bytewax, so it runs the same in a unit test, a notebook, a replay and the live flow.
Snapshot and restore are pickling: a detector is a plain object whose state pickles
(give it ``__setstate__`` defaults when a later version adds a field, so an old
recovery snapshot still resumes).

A new detector plugs in without editing the monitor: name its factory (called with the
job id and the :class:`~trainguard.detectors.settings.DetectorSettings`) under
``detectors.plugins`` in the config, as ``"package.module:factory"``.

>>> from trainguard.detectors.events import LogRecord
>>> class LongLines:
...     "Reports a log line longer than ``limit`` characters (once)."
...     def __init__(self, limit: int = 80) -> None:
...         self.limit, self.seen = limit, False
...     def observe(self, event):
...         if not isinstance(event, LogRecord) or self.seen or len(event.line) <= self.limit:
...             return []
...         self.seen = True
...         return [Finding("crash", "long_line", "application", event.ts, event.ts, evidence=[event.line[:40]])]
...     def advance(self, watermark):
...         return []
>>> detector = LongLines(limit=10)
>>> isinstance(detector, Detector)
True
>>> [f.category for f in detector.observe(LogRecord(ts=1.0, job_id="7", node="n1", line="x" * 11))]
['long_line']
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Protocol, runtime_checkable

from trainguard.detectors.events import Event
from trainguard.detectors.findings import Finding
from trainguard.detectors.settings import DetectorSettings

__all__ = ["Detector", "DetectorFactory", "Finding", "check_plugin", "load_factory"]


@runtime_checkable
class Detector(Protocol):
    """One detector of one key (a job, or an idle node)."""

    def observe(self, event: Event) -> list[Finding]:
        """Take one event (any kind: ignore the ones this detector has no use for); what it found now."""
        ...

    def advance(self, watermark: float) -> list[Finding]:
        """Event time has reached ``watermark``: what was waiting on the clock (a deadline, a hold)."""
        ...


DetectorFactory = Callable[[str, DetectorSettings], Detector]


def load_factory(spec: str) -> DetectorFactory:
    """The factory ``"package.module:name"`` names; ``ValueError`` with one sentence when it cannot be loaded.

    >>> load_factory("collections:Counter").__name__
    'Counter'
    >>> load_factory("no_such_module:Thing")
    Traceback (most recent call last):
    ...
    ValueError: detector plugin 'no_such_module:Thing' cannot be loaded: No module named 'no_such_module'.
    """
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"detector plugin {spec!r} must be written 'package.module:factory'.")
    try:
        factory = getattr(importlib.import_module(module_name), attr)
    except Exception as exc:
        raise ValueError(f"detector plugin {spec!r} cannot be loaded: {exc}.") from None
    if not callable(factory):
        raise ValueError(f"detector plugin {spec!r} is not callable.")
    return factory


def check_plugin(spec: str, settings: DetectorSettings) -> None:
    """Load ``spec``, build one detector with it and check that it follows the protocol and pickles
    (snapshots need that); ``ValueError`` with one sentence when it does not.

    >>> check_plugin("collections:Counter", DetectorSettings())
    Traceback (most recent call last):
    ...
    ValueError: detector plugin 'collections:Counter' cannot build a detector (factory(job_id, settings): TypeError).
    """
    import pickle

    factory = load_factory(spec)
    try:
        detector = factory("config-check", settings)
    except Exception as exc:
        why = f"factory(job_id, settings): {type(exc).__name__}"
        raise ValueError(f"detector plugin {spec!r} cannot build a detector ({why}).") from None
    if not isinstance(detector, Detector):
        raise ValueError(f"detector plugin {spec!r} builds a {type(detector).__name__}, which lacks observe/advance.")
    try:
        pickle.dumps(detector)
    except Exception as exc:
        raise ValueError(f"detector plugin {spec!r} builds a detector that cannot be pickled ({exc}).") from None
