"""Replay a directory of recorded topics, merged in event-time order.

A replay directory holds one file per topic named after it — ``logs.jsonl``,
``progress.jsonl``, ``gpu.jsonl``, ``scheduler.jsonl`` (or ``.parquet``, or a
folder of such files per topic). Missing topics are absent streams. Records
are merged across files by timestamp; a record whose timestamp is implausible
next to its neighbours is emitted where it stands in its file (and the router
will dead-letter it), so one bad timestamp cannot reorder a whole file.
"""

from __future__ import annotations

import heapq
import re
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import msgspec
import pyarrow.parquet as pq
from bytewax.inputs import FixedPartitionedSource, StatefulSourcePartition

from dataflows.records import RawRecord, Routed
from detectors.events import TOPICS, DeadLetter, decode, parse_ts

REPLAY_CLOCK = "replay/0"
# A timestamp this far from the previous one in the same file is treated as an
# outlier for ordering purposes.
_MAX_JUMP_S = 3600.0


class _TsOnly(msgspec.Struct):
    ts: float | str | None = None


_TS = msgspec.json.Decoder(_TsOnly)
_TS_BYTES = re.compile(rb'"ts"\s*:\s*(?:"([^"]{1,64})"|([-+0-9.eE]{1,32}))')


class ReplayError(ValueError):
    """The replay directory cannot be read; one sentence says why."""


def topic_files(directory: Path) -> dict[str, list[Path]]:
    """The files of each topic present in ``directory``."""
    if not directory.is_dir():
        raise ReplayError(f"replay directory {directory} does not exist or is not a directory.")
    found: dict[str, list[Path]] = {}
    for topic in TOPICS:
        files: list[Path] = []
        for suffix in (".jsonl", ".parquet"):
            if (directory / f"{topic}{suffix}").is_file():
                files.append(directory / f"{topic}{suffix}")
        folder = directory / topic
        if folder.is_dir():
            files.extend(sorted(p for p in folder.rglob("*") if p.suffix in (".jsonl", ".parquet")))
        if files:
            found[topic] = files
    if not found:
        raise ReplayError(
            f"replay directory {directory} holds none of {', '.join(t + '.jsonl' for t in TOPICS)} "
            "(or .parquet files or folders named after the topics)."
        )
    return found


def count_records(directory: Path) -> int:
    """How many records a replay directory holds (for progress reporting)."""
    total = 0
    for files in topic_files(directory).values():
        for path in files:
            if path.suffix == ".parquet":
                total += pq.ParquetFile(path).metadata.num_rows
            else:
                with path.open("rb") as fh:
                    total += sum(chunk.count(b"\n") for chunk in iter(lambda: fh.read(1 << 20), b""))
    return total


def _sort_ts(payload: bytes) -> float | None:
    """The record's timestamp, for ordering only (the decoder validates it properly later).

    One byte-level search finds ``"ts": value`` without decoding the whole record;
    anything unusual falls back to a real (partial) JSON decode.
    """
    m = _TS_BYTES.search(payload)
    if m is not None:
        try:
            return parse_ts(m[1].decode() if m[1] is not None else float(m[2]))
        except (ValueError, UnicodeDecodeError, OverflowError):
            pass
    try:
        ts = _TS.decode(payload).ts
        return None if ts is None else parse_ts(ts)
    except (msgspec.DecodeError, ValueError, OverflowError):
        return None


def _jsonl_payloads(path: Path) -> Iterator[bytes]:
    with path.open("rb") as fh:
        for line in fh:
            line = line.rstrip(b"\r\n")
            if line.strip():
                yield line


def _parquet_payloads(path: Path) -> Iterator[bytes]:
    encode = msgspec.json.encode
    for batch in pq.ParquetFile(path).iter_batches(batch_size=10_000):
        for row in batch.to_pylist():
            yield encode({k: (v.timestamp() if isinstance(v, datetime) else v) for k, v in row.items()})


def _topic_stream(topic: str, files: list[Path], decoded: bool) -> Iterator[tuple[float, int, int, Any, bytes]]:
    """``(sort_key, topic index, offset, item, payload)`` with non-decreasing sort keys.

    With ``decoded`` the item is the decoded event (or its dead letter) — decoded once,
    here, since its timestamp is needed for ordering anyway; otherwise ``None``.
    """
    order = TOPICS.index(topic)
    key = None
    offset = 0
    for path in files:
        payloads = _parquet_payloads(path) if path.suffix == ".parquet" else _jsonl_payloads(path)
        for payload in payloads:
            item: Any = None
            if decoded:
                item = decode(topic, payload, 0, offset)
                ts = item.ts if not isinstance(item, DeadLetter) else _sort_ts(payload)
            else:
                ts = _sort_ts(payload)
            if ts is not None and (key is None or abs(ts - key) <= _MAX_JUMP_S):
                key = ts if key is None else max(key, ts)
            yield (key if key is not None else 0.0, order, offset, item, payload)
            offset += 1


def merged_records(directory: Path) -> Iterator[tuple[float, RawRecord]]:
    """Every record of the replay directory, in event-time order."""
    streams = [_topic_stream(t, fs, decoded=False) for t, fs in topic_files(directory).items()]
    for key, order, offset, _item, payload in heapq.merge(*streams):
        yield key, RawRecord(TOPICS[order], 0, offset, payload, REPLAY_CLOCK)


def merged_events(directory: Path) -> Iterator[tuple[float, Routed | DeadLetter]]:
    """Every record decoded, in event-time order: ``(clock, order, event, payload)`` or a dead letter."""
    streams = [_topic_stream(t, fs, decoded=True) for t, fs in topic_files(directory).items()]
    for key, order, offset, item, payload in heapq.merge(*streams):
        yield key, item if isinstance(item, DeadLetter) else (REPLAY_CLOCK, (order, 0, offset), item, payload)


class _ReplayPartition(StatefulSourcePartition[Routed | DeadLetter, int]):
    def __init__(
        self,
        directory: Path,
        speed: float | None,
        batch_size: int,
        resume: int | None,
        on_progress: Callable[[int], None] | None = None,
    ) -> None:
        self._on_progress = on_progress
        self._records = merged_events(directory)
        self._emitted = 0
        for _ in range(resume or 0):  # recovery: skip what was already emitted
            next(self._records, None)
            self._emitted += 1
        self._speed = speed
        self._batch_size = batch_size
        self._pending: tuple[float, Routed | DeadLetter] | None = None
        self._origin: tuple[float, float] | None = None  # (first event ts, wall start)
        self._awake: datetime | None = None

    def next_batch(self) -> list[Routed | DeadLetter]:
        batch: list[Routed | DeadLetter] = []
        self._awake = None
        while len(batch) < self._batch_size:
            item = self._pending or next(self._records, None)
            self._pending = None
            if item is None:
                if batch:
                    break
                raise StopIteration
            if self._speed is not None:
                due = self._due(item[0])
                if due > time.time():
                    self._pending = item
                    self._awake = datetime.fromtimestamp(due, UTC)
                    break
            batch.append(item[1])
        self._emitted += len(batch)
        if self._on_progress is not None and batch:
            self._on_progress(len(batch))
        return batch

    def _due(self, key: float) -> float:
        if self._origin is None:
            self._origin = (key, time.time())
        first_ts, wall_start = self._origin
        assert self._speed is not None
        return wall_start + (key - first_ts) / self._speed

    def next_awake(self) -> datetime | None:
        return self._awake

    def snapshot(self) -> int:
        return self._emitted


class ReplaySource(FixedPartitionedSource[Routed | DeadLetter, int]):
    """All topics of a replay directory as one time-ordered partition.

    ``speed=None`` replays as fast as possible; ``speed=60`` plays one hour of
    event time in one minute of wall time.
    """

    def __init__(self, directory: str | Path, speed: float | None = None, batch_size: int = 2000) -> None:
        if speed is not None and speed <= 0:
            raise ReplayError(f"--speed must be a positive number, got {speed}.")
        self.directory = Path(directory)
        topic_files(self.directory)  # fail now, with a clear sentence, not inside a worker
        self.speed = speed
        self.batch_size = batch_size
        self.on_progress: Callable[[int], None] | None = None

    def list_parts(self) -> list[str]:
        return ["replay"]

    def build_part(self, step_id: str, for_part: str, resume_state: int | None) -> _ReplayPartition:
        return _ReplayPartition(self.directory, self.speed, self.batch_size, resume_state, self.on_progress)
