"""Append-only audit log of decisions and their execution, one JSON object per line, fsynced.

An executed action leaves an ``intent`` entry (on disk *before* the command
runs) and an outcome entry (``applied`` or ``failed``) after; a recommendation or
a suppressed action leaves one entry. A torn last line (a crash mid-write) is
skipped on reading, never fatal.

>>> import tempfile, pathlib
>>> path = pathlib.Path(tempfile.mkdtemp()) / "audit.jsonl"
>>> log = AuditLog(path)
>>> log.append({"event": "recommended", "action_id": "ac-1"})
>>> log.close(); path.read_text()
'{"event":"recommended","action_id":"ac-1"}\\n'
>>> [e["action_id"] for e in read_entries(path)]
['ac-1']
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

import msgspec

OUTCOMES = ("recommended", "applied", "failed", "suppressed")


def open_lines(path: Path) -> BinaryIO:
    """``path`` opened to append JSON Lines, starting on a fresh line: a last line torn by a crash
    mid-write stays one garbled line (skipped when read) and never swallows the next entry."""
    fh = open(path, "a+b")  # noqa: SIM115 - the caller closes it
    fh.seek(0, os.SEEK_END)
    if fh.tell() > 0:
        fh.seek(-1, os.SEEK_END)
        if fh.read(1) != b"\n":
            fh.write(b"\n")
    return fh


class AuditLog:
    """Durable append-only JSON Lines file: each entry is on disk before ``append`` returns."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fh = open_lines(self.path)  # held open for the process lifetime

    def append(self, entry: dict[str, Any] | msgspec.Struct) -> None:
        self.extend([entry])

    def extend(self, entries: list[Any]) -> None:
        if not entries:
            return
        self._fh.write(b"".join(msgspec.json.encode(e) + b"\n" for e in entries))
        self._fh.flush()
        os.fsync(self._fh.fileno())

    def close(self) -> None:
        self._fh.close()


def read_entries(path: str | Path) -> Iterator[dict[str, Any]]:
    """Every complete entry of an audit log (a torn or garbled line is skipped)."""
    p = Path(path)
    if not p.exists():
        return
    with open(p, "rb") as fh:
        for line in fh:
            try:
                entry = msgspec.json.decode(line)
            except msgspec.DecodeError:
                continue
            if isinstance(entry, dict):
                yield entry


def query(
    path: str | Path,
    *,
    job: str | None = None,
    node: str | None = None,
    since: float | None = None,
) -> Any:
    """The audit entries as a polars DataFrame, filtered by job, node (target or suspect) and time."""
    import polars as pl

    rows = []
    for e in read_entries(path):
        nodes = e.get("nodes") or []
        if job is not None and e.get("job_id") != job and e.get("target") != job:
            continue
        if node is not None and e.get("target") != node and node not in nodes:
            continue
        if since is not None and (e.get("recorded_at") or 0) < since:
            continue
        rows.append(
            {
                "recorded_at": e.get("recorded_at"),
                "event": e.get("event"),
                "action_id": e.get("action_id"),
                "action": e.get("action"),
                "target": e.get("target"),
                "mode": e.get("mode"),
                "job_id": e.get("job_id"),
                "anomaly_id": e.get("anomaly_id"),
                "category": e.get("category"),
                "layer": e.get("layer"),
                "user": e.get("user"),
                "reason": e.get("reason"),
            }
        )
    schema = {
        "recorded_at": pl.Float64,
        "event": pl.Utf8,
        "action_id": pl.Utf8,
        "action": pl.Utf8,
        "target": pl.Utf8,
        "mode": pl.Utf8,
        "job_id": pl.Utf8,
        "anomaly_id": pl.Utf8,
        "category": pl.Utf8,
        "layer": pl.Utf8,
        "user": pl.Utf8,
        "reason": pl.Utf8,
    }
    frame = pl.DataFrame(rows, schema=schema)
    return frame.with_columns(pl.from_epoch(pl.col("recorded_at"), time_unit="s").alias("recorded"))


def compact(path: str | Path, parquet: str | Path) -> int:
    """Write the whole audit log to one Parquet file (atomically); returns the entry count."""
    frame = query(path)
    target = Path(parquet)
    tmp = target.with_name(target.name + ".tmp")
    frame.write_parquet(tmp)
    os.replace(tmp, target)
    return frame.height
