"""Replay a directory of recorded topics, merged in event-time order.

A replay directory holds one file per topic named after it — ``logs.jsonl``,
``progress.jsonl``, ``gpu.jsonl``, ``scheduler.jsonl`` (or ``.parquet``, or a
folder of such files per topic). Missing topics are absent streams. Records
are merged across files by timestamp; a record whose timestamp is implausible
next to its neighbours is emitted where it stands in its file (and the router
will dead-letter it), so one bad timestamp cannot reorder a whole file.
"""

from __future__ import annotations

import bisect
import itertools
import math
import re
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from operator import itemgetter
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from bytewax.inputs import FixedPartitionedSource, StatefulSourcePartition

from trainguard.dataflows.records import REPLAY_CLOCK, RawRecord, ReplayRecord, ReplayWindow, Routed, replay_routed
from trainguard.dataflows.replay_columns import GpuBlock, jsonl_blocks, line_blocks, parquet_blocks
from trainguard.detectors.events import TOPICS, DeadLetter, GpuSample, decode, decode_block, parse_ts
from trainguard.detectors.frames import GpuFrame, same_sweep

# A timestamp this far from the previous one in the same file is treated as an
# outlier for ordering purposes.
_MAX_JUMP_S = 3600.0
_ANCHOR_SAMPLE = 16  # timestamps looked at to find where a file starts


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


def replay_directory(directory: str | Path, speed: float | None, split: bool = False) -> Path:
    """A replay source's arguments, checked now — with a clear sentence, not inside a worker
    (``split``: a directory split by shard, whose topic files are in its shards)."""
    if speed is not None and speed <= 0:
        raise ReplayError(f"--speed must be a positive number, got {speed}.")
    path = Path(directory)
    if not split:
        topic_files(path)
    return path


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


_CHUNK = 4096  # records per read-ahead chunk of one topic
_RECORD_BLOCK_BYTES = 1 << 20  # JSON Lines of other topics than gpu decoded this much at a time
_KEY = itemgetter(0)
_ITEM = itemgetter(3)


def _anchor(sample: list[float]) -> float | None:
    """Where a file's sort keys start: its first timestamp near the median of the first few.

    >>> _anchor([1796205600.0, 1796119200.0, 1796119201.0, 1796119202.0])  # a bad first line
    1796119200.0
    """
    if not sample:
        return None
    middle = sorted(sample)[len(sample) // 2]
    return next(ts for ts in sample if abs(ts - middle) <= _MAX_JUMP_S)


class _Placer:
    """Sort keys for one topic's records, in file order, gathered into chunks.

    A record's key is its timestamp, unless that jumps more than ``_MAX_JUMP_S`` from the last
    key (or, first, from :func:`_anchor` of the first timestamps): then it keeps the last key, so
    one bad timestamp cannot reorder a whole file. Keys never decrease.
    """

    def __init__(self, order: int) -> None:
        self.order = order
        self.key: float | None = None
        self.anchor: float | None = None
        # The first records wait until the anchor is known (a file of only bad timestamps waits one chunk).
        self.waiting: list[tuple[float | None, int, Any, bytes | None]] | None = []
        self.sample: list[float] = []
        self.chunk: list[tuple[float, int, int, Any, bytes | None]] = []

    def add(self, ts: float | None, offset: int, item: Any, payload: bytes | None) -> None:
        """One record."""
        if self.waiting is None:
            self._place(ts, offset, item, payload)
            return
        self.waiting.append((ts, offset, item, payload))
        if ts is not None:
            self.sample.append(ts)
        if len(self.sample) == _ANCHOR_SAMPLE or len(self.waiting) == _CHUNK:
            self.settle()

    def add_frames(self, block: GpuBlock, first_offset: int) -> bool:
        """A block of checked GPU rows, as frames — if every row keeps its own timestamp as its key
        (no jump); otherwise nothing is placed and ``False`` says to place the block record by record."""
        keys = self._keys(block.ts)
        if keys is None:
            return False
        starts, frames, offsets = block.frames(keys, range(first_offset, first_offset + len(block)))
        order = self.order
        self.chunk += [(k, order, o, f, None) for k, f, o in zip(starts, frames, offsets, strict=True)]
        return True

    def add_records(self, events: list[Any], payloads: list[bytes], first_offset: int) -> bool:
        """Decoded records of a block, like :meth:`add_frames`: placed at once if no timestamp jumps."""
        keys = self._keys(np.fromiter((e.ts for e in events), dtype=np.float64, count=len(events)))
        if keys is None:
            return False
        order = self.order
        offsets = range(first_offset, first_offset + len(events))
        self.chunk += [(k, order, o, e, p) for k, o, e, p in zip(keys.tolist(), offsets, events, payloads, strict=True)]
        return True

    def _keys(self, ts: np.ndarray) -> np.ndarray | None:
        """The sort keys of a block's timestamps (their running maximum), or ``None`` where one jumps."""
        if self.waiting is not None:
            wanted = _ANCHOR_SAMPLE - len(self.sample)  # timestamps still to sample before the anchor is known
            if len(ts) < wanted or len(self.waiting) + wanted > _CHUNK:
                # Too few timestamps yet, or the record path would settle on a full chunk first (with fewer
                # samples): one by one, as they would wait.
                return None
            self.sample += ts[:wanted].tolist()
            self.settle()
        last = self.key
        if last is None:
            if self.anchor is None or abs(ts[0] - self.anchor) > _MAX_JUMP_S:
                return None
            keys = np.maximum.accumulate(ts)
        else:
            keys = np.maximum.accumulate(np.concatenate(([last], ts)))[1:]
        before = np.concatenate(([ts[0] if last is None else last], keys[:-1]))
        rises = ts > before
        if (ts[rises] - before[rises] > _MAX_JUMP_S).any():
            return None
        self.key = float(keys[-1])
        return keys

    def settle(self) -> None:
        """The anchor is known (or no more records will come to find it): place the waiting records."""
        if self.waiting is None:
            return
        self.anchor = _anchor(self.sample)
        waiting, self.waiting = self.waiting, None
        for record in waiting:
            self._place(*record)

    def take(self) -> list[tuple[float, int, int, Any, bytes | None]]:
        chunk, self.chunk = self.chunk, []
        return chunk

    def _place(self, ts: float | None, offset: int, item: Any, payload: bytes | None) -> None:
        key, anchor = self.key, self.anchor
        if ts is not None and (
            key < ts <= key + _MAX_JUMP_S if key is not None else anchor is not None and abs(ts - anchor) <= _MAX_JUMP_S
        ):
            self.key = key = ts
        self.chunk.append((key if key is not None else anchor or 0.0, self.order, offset, item, payload))


def _topic_chunks(
    topic: str, files: list[Path], decoded: bool
) -> Iterator[list[tuple[float, int, int, Any, bytes | None]]]:
    """Lists of ``(sort_key, topic index, offset, item, payload)``; sort keys never decrease.

    With ``decoded`` the item is the decoded event (or its dead letter) — decoded once,
    here, since its timestamp is needed for ordering anyway; otherwise ``None``. Decoded
    GPU telemetry comes as frames (a node's samples of one instant), read as columns
    where the columns allow (:mod:`dataflows.replay_columns`).
    """
    placer = _Placer(TOPICS.index(topic))
    offset = 0
    frames = decoded and topic == "gpu"  # GPU samples go on as frames
    for path in files:
        for block, raw in _blocks(path, topic if decoded else None):
            if _placed(placer, block, raw, offset):
                offset += len(block)  # type: ignore[arg-type]
            else:
                for payload in _payloads(raw):
                    item: Any = None
                    if decoded:
                        item = decode(topic, payload, 0, offset)
                        ts = item.ts if type(item) is not DeadLetter else _sort_ts(payload)
                    else:
                        ts = _sort_ts(payload)
                    placer.add(ts, offset, item, payload)
                    offset += 1
            if len(placer.chunk) >= _CHUNK:
                yield _sweeps(placer.take()) if frames else placer.take()
    placer.settle()  # a topic shorter than the sample
    if placer.chunk:
        yield _sweeps(placer.take()) if frames else placer.take()


def _placed(placer: _Placer, block: GpuBlock | list[Any] | None, raw: Any, offset: int) -> bool:
    """Whether a block decoded at once is placed as it is (else it is read record by record)."""
    if type(block) is GpuBlock:
        return placer.add_frames(block, offset)
    return type(block) is list and placer.add_records(block, raw.split(b"\n")[:-1], offset)


def _blocks(path: Path, decoded: str | None) -> Iterator[tuple[GpuBlock | list[Any] | None, Any]]:
    """A file's records a block at a time: ``(what was decoded at once, or None; what to read records from)``.

    ``decoded``: the topic, whose records are to be decoded — a ``gpu`` file's blocks as checked
    columns, a JSON Lines file's blocks of other topics in one call to the decoder
    (:func:`~trainguard.detectors.events.decode_block`).
    """
    if decoded == "gpu":
        yield from parquet_blocks(path) if path.suffix == ".parquet" else jsonl_blocks(path)
    elif path.suffix == ".parquet":
        for batch in pq.ParquetFile(path).iter_batches(batch_size=10_000):
            yield None, batch.to_pylist()
    elif decoded is not None:
        for block in line_blocks(path, _RECORD_BLOCK_BYTES):
            yield decode_block(decoded, block), block
    else:
        with path.open("rb") as fh:
            while lines := fh.readlines(1 << 20):
                yield None, lines


def _payloads(raw: Any) -> Iterator[bytes]:
    """Each record's bytes from what :func:`_blocks` gave: lines of JSON (a block of bytes, or a list of
    lines), or Parquet rows (a record batch, or dicts)."""
    if isinstance(raw, bytes | bytearray):
        raw = raw.split(b"\n")
    elif isinstance(raw, pa.RecordBatch):
        raw = raw.to_pylist()
    encode = msgspec.json.encode
    for line in raw:
        if isinstance(line, dict):
            yield encode({k: (v.timestamp() if isinstance(v, datetime) else v) for k, v in line.items()})
            continue
        line = line.rstrip(b"\r\n")
        if line.strip():
            yield line


def _sweeps(chunk: list[tuple[float, int, int, Any, bytes]]) -> list[tuple[float, int, int, Any, bytes | None]]:
    """The chunk with each run of consecutive GPU samples of one node and instant (each GPU once) as one
    :class:`GpuFrame` at the place of its first sample (a frame keeps no bytes: a dead letter re-encodes it)."""
    if GpuSample not in map(type, map(_ITEM, chunk)):  # (in C) blocks read as columns are frames already
        return chunk  # type: ignore[return-value]
    out: list[tuple[float, int, int, Any, bytes | None]] = []
    run: list[tuple[float, int, int, Any, bytes]] = []
    for record in chunk:
        item = record[3]
        if type(item) is GpuSample:
            if run and _joins(run, record[0], item):
                run.append(record)
                continue
            _flush(run, out)
            run = [record]
            continue
        _flush(run, out)
        run = []
        out.append(record)
    _flush(run, out)
    return out


def _joins(run: list[tuple[float, int, int, Any, bytes]], key: float, sample: GpuSample) -> bool:
    first = run[0][3]
    gpus = [r[3].gpu for r in run]
    return key == run[0][0] and same_sweep(sample.ts, sample.node, sample.gpu, first.ts, first.node, gpus)  # type: ignore[arg-type]


def _flush(run: list[tuple[float, int, int, Any, bytes]], out: list[tuple[float, int, int, Any, bytes | None]]) -> None:
    if len(run) == 1:
        out.append(run[0])
    elif run:
        key, order, offset, _, _ = run[0]
        out.append((key, order, offset, GpuFrame.from_samples([r[3] for r in run]), None))


def _merge(
    streams: list[Iterator[list[tuple[float, int, int, Any, bytes]]]],
) -> Iterator[list[tuple[float, int, int, Any, bytes]]]:
    """The streams' records in ``(sort key, topic, offset)`` order, like ``heapq.merge``, a window at a time.

    It merges a window at a time: every buffered record below the smallest last key
    of the streams that may hold more is safe to hand out, and one C-level sort
    orders them — far cheaper per record than a heap in Python.
    """
    n = len(streams)
    bufs: list[list[tuple[float, int, int, Any, bytes]]] = [[] for _ in streams]
    done = [False] * n

    def read_on(i: int) -> None:
        more = next(streams[i], None)
        if more is None:
            done[i] = True
        else:
            bufs[i] += more

    while True:
        for i in range(n):
            if not bufs[i] and not done[i]:
                read_on(i)
        if not any(bufs):
            return
        bounds = [bufs[i][-1][0] for i in range(n) if not done[i]]
        limit = min(bounds) if bounds else math.inf
        window: list[tuple[float, int, int, Any, bytes]] = []
        for i, buf in enumerate(bufs):
            cut = bisect.bisect_left(buf, limit, key=_KEY)
            if cut:
                window += buf[:cut]
                bufs[i] = buf[cut:]
        if window:
            # By (sort key, topic index, offset): no two records share a topic and offset, so the tuples
            # compare as those three alone would (never reaching the items), without a key tuple each.
            window.sort()
            yield window
            continue
        for i in range(n):  # everything buffered sits at the bound: read on where the bound comes from
            if not done[i] and bufs[i][-1][0] == limit:
                read_on(i)


def merged_records(directory: Path) -> Iterator[tuple[float, RawRecord]]:
    """Every record of the replay directory, in event-time order."""
    streams = [_topic_chunks(t, fs, decoded=False) for t, fs in topic_files(directory).items()]
    for window in _merge(streams):
        for key, order, offset, _item, payload in window:
            yield key, RawRecord(TOPICS[order], 0, offset, payload, REPLAY_CLOCK)


def merged_events(directory: Path) -> Iterator[tuple[float, Routed | DeadLetter]]:
    """Every record decoded, in event-time order, with its sort key: ``(clock, order, event, payload)`` or a
    dead letter."""
    for window in _decoded_windows(directory):
        yield from zip([record[0] for record in window], replay_routed(window), strict=True)


def merged_event_windows(directory: Path) -> Iterator[list[ReplayRecord]]:
    """The records of :func:`merged_events` as the merge orders them, a list at a time (no Python step per
    record to hand them on; :func:`~trainguard.dataflows.records.replay_routed` makes them :class:`Routed`)."""
    yield from _decoded_windows(directory)


def _decoded_windows(directory: Path) -> Iterator[list[ReplayRecord]]:
    return _merge([_topic_chunks(t, fs, decoded=True) for t, fs in topic_files(directory).items()])  # type: ignore[arg-type]


class _Windows:
    """Batches cut from lists of records as fast as possible (what :class:`_Paced` does at full speed, without
    a Python step per record)."""

    def __init__(
        self, windows: Iterator[list[ReplayRecord]], batch_size: int, on_progress: Callable[[int], None] | None
    ) -> None:
        self._windows = windows
        self._batch_size = batch_size
        self._on_progress = on_progress
        self._window: list[ReplayRecord] = []
        self._at = 0
        self.awake: datetime | None = None

    def skip(self, n: int) -> int:
        """Drop the next ``n`` records (already processed before a restart); how many there were."""
        skipped = 0
        while skipped < n and self._more():
            step = min(n - skipped, len(self._window) - self._at)
            self._at += step
            skipped += step
        return skipped

    def next_batch(self) -> list[ReplayRecord]:
        """The next batch; raises ``StopIteration`` once the records are exhausted."""
        batch = self._take(self._batch_size)
        if not batch:
            raise StopIteration
        if self._on_progress is not None:
            self._on_progress(len(batch))
        return batch

    def _take(self, n: int) -> list[ReplayRecord]:
        out: list[ReplayRecord] = []
        while len(out) < n and self._more():
            end = self._at + n - len(out)
            out += self._window[self._at : end]
            self._at = min(end, len(self._window))
        return out

    def _more(self) -> bool:
        """Whether records remain (the next window taken up when this one is used)."""
        while self._at >= len(self._window):
            window = next(self._windows, None)
            if window is None:
                return False
            self._window, self._at = window, 0
        return True


class _Paced:
    """Batches of a time-ordered record stream, as fast as possible or paced to ``speed`` × event time."""

    def __init__(
        self,
        records: Iterator[tuple[float, Routed | DeadLetter]],
        speed: float | None,
        batch_size: int,
        on_progress: Callable[[int], None] | None,
    ) -> None:
        self._records = records
        self._speed = speed
        self._batch_size = batch_size
        self._on_progress = on_progress
        self._pending: tuple[float, Routed | DeadLetter] | None = None
        self._origin: tuple[float, float] | None = None  # (first event ts, wall start)
        self.awake: datetime | None = None
        self.newest = float("-inf")  # sort key of the last record handed out

    def skip(self, n: int) -> int:
        """Drop the next ``n`` records (already processed before a restart); how many there were."""
        return sum(1 for _ in itertools.islice(self._records, n))

    def next_batch(self) -> list[Routed | DeadLetter]:
        """The next batch; raises ``StopIteration`` once the records are exhausted."""
        if self._speed is None and self._pending is None:
            chunk = list(itertools.islice(self._records, self._batch_size))  # no Python loop per record
            if not chunk:
                raise StopIteration
            self.newest = chunk[-1][0]
            batch = [item for _, item in chunk]
        else:
            batch = self._paced_batch()
        if self._on_progress is not None and batch:
            self._on_progress(len(batch))
        return batch

    def _paced_batch(self) -> list[Routed | DeadLetter]:
        batch: list[Routed | DeadLetter] = []
        self.awake = None
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
                    self.awake = datetime.fromtimestamp(due, UTC)
                    break
            self.newest = item[0]
            batch.append(item[1])
        return batch

    def _due(self, key: float) -> float:
        if self._origin is None:
            self._origin = (key, time.time())
        first_ts, wall_start = self._origin
        assert self._speed is not None
        return wall_start + (key - first_ts) / self._speed


class _ReplayPartition(StatefulSourcePartition[list[Routed | DeadLetter] | ReplayWindow, int]):
    def __init__(self, paced: _Paced | _Windows, resume: int | None) -> None:
        self._paced = paced
        self._emitted = paced.skip(resume or 0)  # recovery: skip what was already emitted

    def next_batch(self) -> list[list[Routed | DeadLetter] | ReplayWindow]:
        batch = self._paced.next_batch()
        self._emitted += len(batch)
        # The batch as one item: Bytewax moves one object to the router, not a few thousand (at full speed,
        # the merged records as they are).
        if not batch:
            return []
        return [ReplayWindow(batch)] if type(self._paced) is _Windows else [batch]  # type: ignore[list-item]

    def next_awake(self) -> datetime | None:
        return self._paced.awake

    def snapshot(self) -> int:
        return self._emitted


class ReplaySource(FixedPartitionedSource[list[Routed | DeadLetter] | ReplayWindow, int]):
    """All topics of a replay directory as one time-ordered partition.

    ``speed=None`` replays as fast as possible; ``speed=60`` plays one hour of
    event time in one minute of wall time.
    """

    def __init__(self, directory: str | Path, speed: float | None = None, batch_size: int = 2000) -> None:
        self.directory = replay_directory(directory, speed)
        self.speed = speed
        self.batch_size = batch_size
        self.on_progress: Callable[[int], None] | None = None

    def list_parts(self) -> list[str]:
        return ["replay"]

    def build_part(self, step_id: str, for_part: str, resume_state: int | None) -> _ReplayPartition:
        if self.speed is None:
            return _ReplayPartition(
                _Windows(merged_event_windows(self.directory), self.batch_size, self.on_progress), resume_state
            )
        paced = _Paced(merged_events(self.directory), self.speed, self.batch_size, self.on_progress)
        return _ReplayPartition(paced, resume_state)
