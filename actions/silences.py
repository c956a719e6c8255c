"""Silences: maintenance windows and known problems that must not page anyone or be acted on.

A silence matches anomalies by node, job (a glob on the job id), kind and partition (any it
leaves out matches everything) during ``[starts_at, ends_at)``, compared with the anomaly's
detection time (event time: a live run and a replay agree). A silenced anomaly is still
detected and archived; its actions are published ``suppressed`` with the silence named, and
no notification goes out. A silence ends by itself; ``expire`` ends it early.

Silences live in a JSON Lines file, one record per change (the latest record per id wins),
so the CLI, the console and a running flow share them; every change is also audited.

>>> import tempfile, pathlib
>>> from trainguard.detectors.events import Anomaly
>>> store = Silences(pathlib.Path(tempfile.mkdtemp()) / "silences.jsonl")
>>> s = store.add(node="gpu-node-07", duration_s=4 * 3600, reason="RMA", by="alice", now=1000.0)
>>> a = Anomaly(anomaly_id="an-1", detected_at=2000.0, kind="crash", category="xid_79", nodes=["gpu-node-07"])
>>> store.matching(a) == s, store.matching(a, partitions={"gpu"}) == s
(True, True)
>>> _ = store.expire(s.silence_id, by="alice", now=3000.0)
>>> store.matching(Anomaly(anomaly_id="an-2", detected_at=3500.0, kind="crash", category="x", nodes=["gpu-node-07"]))
"""

from __future__ import annotations

import fnmatch
import os
import re
import secrets
import time
from collections.abc import Iterable
from pathlib import Path

import msgspec

from trainguard.actions.audit import AuditLog, open_lines, read_entries
from trainguard.detectors.events import Anomaly

__all__ = ["Silence", "SilenceError", "Silences", "parse_duration"]

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*$")
_UNIT_S = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


class SilenceError(ValueError):
    """A silence that cannot be added or expired; the message says why."""


class Silence(msgspec.Struct, kw_only=True, frozen=True):
    silence_id: str
    starts_at: float
    ends_at: float
    reason: str
    created_by: str
    node: str | None = None
    job: str | None = None  # a glob on the job id
    kind: str | None = None
    partition: str | None = None
    expired_at: float | None = None
    expired_by: str | None = None

    def active(self, at: float) -> bool:
        end = self.ends_at if self.expired_at is None else min(self.ends_at, self.expired_at)
        return self.starts_at <= at < end

    def covers(self, anomaly: Anomaly, partitions: Iterable[str] = ()) -> bool:
        """Whether this silence's matchers all match ``anomaly`` (``partitions``: of its nodes and job)."""
        if self.node is not None and self.node not in anomaly.nodes:
            return False
        if self.job is not None and not fnmatch.fnmatchcase(anomaly.job_id or "", self.job):
            return False
        if self.kind is not None and self.kind != anomaly.kind:
            return False
        return self.partition is None or self.partition in set(partitions)

    def describe(self) -> str:
        what = ", ".join(
            f"{k} {v}"
            for k, v in (("node", self.node), ("job", self.job), ("kind", self.kind), ("partition", self.partition))
            if v is not None
        )
        return f"{self.silence_id} ({what}): {self.reason}"


def parse_duration(text: str) -> float:
    """Seconds in ``4h``, ``30m``, ``2d``, ``90`` (seconds).

    >>> parse_duration("4h"), parse_duration("90")
    (14400.0, 90.0)
    """
    m = _DURATION.match(text)
    if not m or float(m[1]) <= 0:
        raise SilenceError(f"{text!r} is not a duration; write it like 30m, 4h or 2d.")
    return float(m[1]) * _UNIT_S[m[2]]


class Silences:
    """The silences file: read again whenever it changed on disk."""

    def __init__(self, path: str | Path, audit: AuditLog | None = None) -> None:
        self.path = Path(path)
        self.audit = audit
        self._stamp: tuple[int, int] | None = None
        self._by_id: dict[str, Silence] = {}

    def all(self) -> list[Silence]:
        self._refresh()
        return sorted(self._by_id.values(), key=lambda s: s.starts_at)

    def active(self, at: float) -> list[Silence]:
        return [s for s in self.all() if s.active(at)]

    def matching(self, anomaly: Anomaly, partitions: Iterable[str] = ()) -> Silence | None:
        """The silence in force at the anomaly's detection time that covers it, if any."""
        parts = set(partitions)
        return next((s for s in self.active(anomaly.detected_at) if s.covers(anomaly, parts)), None)

    def add(
        self,
        *,
        duration_s: float,
        reason: str,
        by: str,
        node: str | None = None,
        job: str | None = None,
        kind: str | None = None,
        partition: str | None = None,
        now: float | None = None,
    ) -> Silence:
        if not any((node, job, kind, partition)):
            raise SilenceError("a silence needs at least one of --node, --job, --kind, --partition.")
        if not reason.strip():
            raise SilenceError("a silence needs a --reason (it is shown to whoever wonders why nothing fired).")
        start = time.time() if now is None else now
        silence = Silence(
            silence_id=f"si-{secrets.token_hex(4)}",
            starts_at=start,
            ends_at=start + duration_s,
            reason=reason.strip(),
            created_by=by,
            node=node,
            job=job,
            kind=kind,
            partition=partition,
        )
        self._write(silence, "silence_added", by, start)
        return silence

    def expire(self, silence_id: str, *, by: str, now: float | None = None) -> Silence:
        self._refresh()
        current = self._by_id.get(silence_id)
        at = time.time() if now is None else now
        if current is None:
            raise SilenceError(f"no silence {silence_id!r}; `trainguard silence list` shows them.")
        if not current.active(at):
            raise SilenceError(f"silence {silence_id} is not in force any more.")
        expired = msgspec.structs.replace(current, expired_at=at, expired_by=by)
        self._write(expired, "silence_expired", by, at)
        return expired

    def _write(self, silence: Silence, event: str, by: str, at: float) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open_lines(self.path) as fh:
            fh.write(msgspec.json.encode(silence) + b"\n")
            fh.flush()
            os.fsync(fh.fileno())
        if self.audit is not None:
            self.audit.append({"event": event, "recorded_at": at, "user": by, **msgspec.structs.asdict(silence)})
        self._stamp = None  # read it again

    def _refresh(self) -> None:
        try:
            stat = self.path.stat()
        except FileNotFoundError:
            self._by_id, self._stamp = {}, None
            return
        stamp = (stat.st_mtime_ns, stat.st_size)
        if stamp == self._stamp:
            return
        by_id: dict[str, Silence] = {}
        for entry in read_entries(self.path):
            try:
                silence = msgspec.convert(entry, Silence)
            except msgspec.ValidationError:
                continue  # a record this version cannot read is skipped, never fatal
            by_id[silence.silence_id] = silence
        self._by_id, self._stamp = by_id, stamp
