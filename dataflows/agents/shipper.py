"""Log shipper: tail growing training logs and publish each line as a wire-contract ``logs`` record.

Only whole lines leave (a half-written line waits for its newline). Offsets are kept per
file in a state file, written atomically *after* the broker confirmed delivery, so a
restart neither loses lines nor floods the topic with old ones (at-least-once: a crash
between delivery and the state write re-sends that last batch). A file that shrinks was
truncated and is read again from the start; a file replaced under the same name (log
rotation) is first read to its end through the open handle, then the new one from its start.
Job id comes from ``slurm-<job>.out`` names (or ``--job``), the rank from ``srun -l`` and
``[rankN]:`` prefixes or from torchrun's own log layout (``--log-dir D --redirects 3`` writes
``D/<run>/attempt_<n>/<local rank>/stdout.log``), the timestamp from the line when it has one
(else the time it was read). A path with ``*``, ``?`` or ``[`` is a glob pattern, looked at again
on every poll: torchrun names its run folder only when the job starts, and a restart adds an
``attempt_<n+1>``.
"""

from __future__ import annotations

import glob
import json
import os
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

from trainguard.agents.logimport import job_from_path
from trainguard.agents.loop import Agent, Publish
from trainguard.detectors.logprefix import parse_prefix

_KERNEL_HINTS = ("NVRM:", "kernel:", "SXid", "nvidia-nvswitch", "mlx5_core")
# torchrun --log-dir: <dir>/<run id>_<suffix>/attempt_<n>/<local rank>/{stdout,stderr}.log
_TORCHRUN_LAYOUT = re.compile(r"/attempt_\d+/(?P<rank>\d+)/(?:stdout|stderr)\.log$")
_GLOB = re.compile(r"[*?\[]")


def torchrun_rank(path: Path, rank_base: int = 0) -> int | None:
    """The rank a file of torchrun's log layout belongs to: its local rank plus ``rank_base``
    (the node's first rank: ``node_rank × nproc_per_node``; 0 on one node).

    >>> torchrun_rank(Path("/logs/6d7d_bz0z/attempt_0/2/stderr.log")), torchrun_rank(Path("train.log"))
    (2, None)
    """
    m = _TORCHRUN_LAYOUT.search(path.as_posix())
    return None if m is None else rank_base + int(m["rank"])


@dataclass
class _Tail:
    path: Path
    handle: IO[bytes] | None = None
    inode: int | None = None
    offset: int = 0
    pending: bytes = b""
    retired: list[IO[bytes]] = field(default_factory=list)  # rotated-away files still being drained


class LogTailer(Agent):
    """Follows files, hands out new whole lines, remembers where it stopped."""

    name = "ship-logs"

    def __init__(
        self,
        paths: Iterable[Path],
        state_file: Path | None = None,
        node: str = "unknown",
        job_id: str | None = None,
        year: int | None = None,
        rank_base: int = 0,
    ) -> None:
        paths = [str(p) for p in paths]
        self.patterns = [p for p in paths if _GLOB.search(p)]
        self.tails = {p: _Tail(Path(p)) for p in paths if p not in self.patterns}
        self.rank_base = rank_base
        self.state_file = state_file
        self.node = node
        self.job_id = job_id
        self.year = year or datetime.now(UTC).year
        self._saved: dict[str, dict[str, int]] = {}
        if state_file is not None and state_file.is_file():
            self._saved = json.loads(state_file.read_text())
            for key in self._saved.keys() & self.tails.keys():
                self._resume(self.tails[key])

    def _resume(self, tail: _Tail) -> _Tail:
        """Where the last run stopped in this file, if it shipped from it."""
        entry = self._saved.get(str(tail.path))
        if entry is not None:
            tail.inode, tail.offset = entry["inode"], entry["offset"]
        return tail

    def poll(self) -> list[Publish]:
        return [("logs", record) for record in self.read()]

    def read(self, now: Callable[[], float] = time.time) -> list[dict[str, Any]]:
        """New whole lines of every file, as log records."""
        out: list[dict[str, Any]] = []
        for pattern in self.patterns:  # files that appeared since the last poll start at their beginning
            for found in sorted(glob.glob(pattern, recursive=True)):
                if found not in self.tails:
                    self.tails[found] = self._resume(_Tail(Path(found)))
        for tail in self.tails.values():
            for line in self._read(tail):
                out.append(self._record(tail.path, line, now()))
        return out

    def _read(self, tail: _Tail) -> list[bytes]:
        lines: list[bytes] = []
        try:
            stat = tail.path.stat()
        except FileNotFoundError:
            stat = None
        if stat is not None and tail.inode is not None and stat.st_ino != tail.inode:
            if tail.handle is not None:  # rotated: finish the old file through its open handle
                lines += self._lines(tail, tail.handle.read())
                tail.retired.append(tail.handle)
            tail.handle, tail.offset, tail.pending = None, 0, b""
        if stat is None:
            return lines
        if tail.handle is None:
            tail.handle = open(tail.path, "rb")  # noqa: SIM115 - kept open to survive rotation
            tail.inode = stat.st_ino
            tail.handle.seek(min(tail.offset, stat.st_size))
            if tail.offset > stat.st_size:
                tail.offset = 0
        if stat.st_size < tail.offset:  # truncated in place
            tail.handle.seek(0)
            tail.offset, tail.pending = 0, b""
        lines += self._lines(tail, tail.handle.read())
        return lines

    def _lines(self, tail: _Tail, data: bytes) -> list[bytes]:
        if not data:
            return []
        tail.offset += len(data)  # bytes read from the file; a pending partial line is re-read after a restart
        buffer = tail.pending + data
        cut = buffer.rfind(b"\n")
        if cut == -1:
            tail.pending = buffer
            return []
        tail.pending = buffer[cut + 1 :]
        whole = buffer[:cut]
        return [line.rstrip(b"\r") for line in whole.split(b"\n") if line.strip()]

    def _record(self, path: Path, raw: bytes, read_at: float) -> dict[str, Any]:
        text = raw.decode("utf-8", errors="replace")
        parsed = parse_prefix(text, self.year)
        return {
            "ts": parsed.ts if parsed.ts is not None else read_at,
            "job_id": self.job_id or job_from_path(path),
            "node": self.node,
            "rank": parsed.rank if parsed.rank is not None else torchrun_rank(path, self.rank_base),
            "source": "kernel" if any(h in parsed.text for h in _KERNEL_HINTS) else "app",
            "line": parsed.text,
        }

    def commit(self) -> None:
        """Remember the offsets of everything handed out so far (call after delivery is confirmed)."""
        if self.state_file is None:
            return
        state = {
            key: {"inode": t.inode, "offset": t.offset - len(t.pending)}
            for key, t in self.tails.items()
            if t.inode is not None
        }
        tmp = self.state_file.with_name(self.state_file.name + ".tmp")
        tmp.write_text(json.dumps(state))
        os.replace(tmp, self.state_file)
        for tail in self.tails.values():
            for handle in tail.retired:
                handle.close()
            tail.retired.clear()

    def close(self) -> None:
        for tail in self.tails.values():
            if tail.handle is not None:
                tail.handle.close()
