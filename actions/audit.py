"""Append-only audit log of decisions, one JSON object per line, fsynced.

>>> import tempfile, pathlib
>>> path = pathlib.Path(tempfile.mkdtemp()) / "audit.jsonl"
>>> log = AuditLog(path)
>>> log.append({"event": "recommended", "action_id": "ac-1"})
>>> log.close(); path.read_text()
'{"event":"recommended","action_id":"ac-1"}\\n'
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import msgspec


class AuditLog:
    """Durable append-only JSON Lines file: each entry is on disk before ``append`` returns."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fh = open(self.path, "ab")  # noqa: SIM115 - held open for the process lifetime

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
