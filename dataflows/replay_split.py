"""A replay directory split by router shard, so each worker process reads only its own share.

:class:`~trainguard.dataflows.replay_shards.ShardedReplaySource` lets every worker read and
decode the whole replay and keep its share: simple, but each worker pays for every record.
:func:`split_replay` does that sorting once and writes what :func:`~trainguard.dataflows.
replay_shards.shard_events` would give each shard — in its order, with each record's sort key,
topic and offset, its bytes as they came, the decoder's dead letters with their reasons, and the
marks of how far the whole stream got — to ``OUT/shard-K-of-N/stream.arrows`` (Arrow IPC).
``trainguard replay OUT --processes N`` then has worker ``K`` read that file alone, and finds
exactly what one worker finds on the original directory.

GPU frames the reader cut from columns have no bytes of their own: a frame is stored as its
array's bytes (every value to the bit, null as NaN) with its node, GPUs and addresses, not as text.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pyarrow as pa

from trainguard.dataflows.records import Routed, routed
from trainguard.dataflows.replay import REPLAY_CLOCK, ReplayError, _merge, _topic_chunks, count_records, topic_files
from trainguard.detectors.events import TOPICS, DeadLetter, JobEvent, NodeEvent, decode
from trainguard.detectors.frames import FIELDS, GpuFrame
from trainguard.detectors.shards import JobPlacement, shard_of

STREAM = "stream.arrows"
SPLIT = "split.json"  # the split's shards and how many records the original held
_SHARD_DIR = re.compile(r"^shard-(\d+)-of-(\d+)$")
_MARK = -1  # the order of a row that only says how far the whole stream got
_SCHEMA = pa.schema(
    [
        ("key", pa.float64()),
        ("order", pa.int8()),
        ("offset", pa.int64()),
        ("payload", pa.binary()),  # a record's bytes; a frame's (see _frame_bytes); null for a mark
        ("frame", pa.bool_()),
        ("reason", pa.string()),  # a dead letter's
    ]
)
_ROWS = 50_000  # rows per record batch written


class _Frame(msgspec.Struct, array_like=True):
    ts: float
    node: str
    gpus: tuple[int, ...]
    values: bytes
    uuid: list[str | None] | None
    pci_bus_id: list[str | None] | None
    rare: bool


_FRAME = msgspec.msgpack.Decoder(_Frame)


def split_replay(directory: Path, shards: int, out: Path) -> list[int]:
    """Write ``directory`` split into ``shards`` shards under ``out``; how many records each holds."""
    if shards < 1:
        raise ReplayError(f"--shards must be 1 or more, got {shards}.")
    files = topic_files(directory)
    writers = []
    for shard in range(shards):
        folder = out / f"shard-{shard}-of-{shards}"
        folder.mkdir(parents=True, exist_ok=True)
        writers.append(_Writer(folder / STREAM))
    placement = JobPlacement()
    owners: dict[str, int] = {}
    every = range(shards)
    for window in _merge([_topic_chunks(t, fs, decoded=True) for t, fs in files.items()]):
        last: list[float | None] = [None] * shards  # each shard's last key in this window
        for key, order, offset, event, payload in window:
            cls = type(event)
            if cls is DeadLetter:
                writers[0].dead(key, order, event)
                last[0] = key
                continue
            if cls is JobEvent:
                placement.apply(event)
                holders: range | tuple[int] = every
            elif cls is NodeEvent:
                holders = every
            else:
                job = placement.job_for(event) or event.node
                owner = owners.get(job)
                if owner is None:
                    owner = owners[job] = shard_of(job, shards)
                holders = (owner,)
            for shard in holders:
                writers[shard].record(key, order, offset, event, payload)
                last[shard] = key
        end = window[-1][0]
        for shard in every:
            if last[shard] != end:
                writers[shard].mark(end)  # how far the whole stream got
    for writer in writers:
        writer.close()
    counts = [writer.records for writer in writers]
    summary = {"shards": shards, "records": count_records(directory), "held": counts}
    (out / SPLIT).write_bytes(msgspec.json.encode(summary))
    return counts


class _Writer:
    def __init__(self, path: Path) -> None:
        self._sink = pa.ipc.new_stream(str(path), _SCHEMA)
        self._rows: list[tuple[float, int, int, bytes | None, bool, str | None]] = []
        self.records = 0

    def record(self, key: float, order: int, offset: int, event: Any, payload: bytes | None) -> None:
        frame = payload is None and type(event) is GpuFrame
        self._add((key, order, offset, _frame_bytes(event) if frame else payload, frame, None))
        self.records += 1

    def dead(self, key: float, order: int, letter: DeadLetter) -> None:
        self._add((key, order, letter.offset, letter.payload, False, letter.reason))
        self.records += 1

    def mark(self, key: float) -> None:
        self._add((key, _MARK, 0, None, False, None))

    def _add(self, row: tuple[float, int, int, bytes | None, bool, str | None]) -> None:
        self._rows.append(row)
        if len(self._rows) >= _ROWS:
            self._flush()

    def _flush(self) -> None:
        if self._rows:
            columns = zip(*self._rows, strict=True)
            arrays = [pa.array(column, field.type) for column, field in zip(columns, _SCHEMA, strict=True)]
            self._sink.write_batch(pa.record_batch(arrays, _SCHEMA))
            self._rows = []

    def close(self) -> None:
        self._flush()
        self._sink.close()


def _frame_bytes(frame: GpuFrame) -> bytes:
    uuid = list(frame.uuid) if frame.uuid else None
    pci = list(frame.pci_bus_id) if frame.pci_bus_id else None
    record = _Frame(frame.ts, frame.node, frame.gpus, frame.values.tobytes(), uuid, pci, frame.rare)
    return msgspec.msgpack.encode(record)


def _frame(data: bytes) -> GpuFrame:
    f = _FRAME.decode(data)
    values = np.frombuffer(f.values, dtype=np.float64).reshape(len(FIELDS), len(f.gpus)).copy()
    return GpuFrame(f.ts, f.node, f.gpus, values, f.uuid, f.pci_bus_id, None, f.rare)


def split_records(directory: Path) -> int:
    """How many records the replay that was split held (for progress reports)."""
    try:
        return int(msgspec.json.decode((directory / SPLIT).read_bytes())["records"])
    except (OSError, msgspec.DecodeError, KeyError, TypeError, ValueError):
        raise ReplayError(f"{directory / SPLIT} is missing or unreadable: split the replay again.") from None


def holds_topics(directory: Path) -> bool:
    """Whether ``directory`` holds any topic's file or folder (a replay of its own)."""
    return any((directory / f"{topic}{suffix}").exists() for topic in TOPICS for suffix in (".jsonl", ".parquet", ""))


def is_split(directory: Path) -> bool:
    """Whether ``directory`` holds a replay split by shard."""
    return directory.is_dir() and any(_SHARD_DIR.match(p.name) for p in directory.iterdir())


def shard_folder(directory: Path, shard: int, shards: int) -> Path | None:
    """The folder worker ``shard`` of ``shards`` reads when ``directory`` was split (``None``: it was not).
    Raises :class:`ReplayError` when it was split into another number of shards."""
    splits = {int(m[2]) for p in directory.iterdir() if (m := _SHARD_DIR.match(p.name))}
    if not splits:
        return None
    if holds_topics(directory):
        raise ReplayError(f"{directory} holds both a split replay (shard-*) and topic files: keep one or the other.")
    if splits != {shards}:
        found = ", ".join(str(n) for n in sorted(splits))
        raise ReplayError(f"{directory} is split into {found} shards: replay it with --processes {found}.")
    folder = directory / f"shard-{shard}-of-{shards}"
    if not (folder / STREAM).is_file():
        raise ReplayError(f"{folder / STREAM} is missing: split the replay again (trainguard split-replay).")
    return folder


def split_events(folder: Path) -> Iterator[tuple[float, Routed | DeadLetter | None]]:
    """A shard's stream as :func:`~trainguard.dataflows.replay_shards.shard_events` gives it."""
    with pa.ipc.open_stream(str(folder / STREAM)) as reader:
        for batch in reader:
            keys, orders, offsets, payloads, frames, reasons = (column.to_pylist() for column in batch.columns)
            for key, order, offset, payload, frame, reason in zip(
                keys, orders, offsets, payloads, frames, reasons, strict=True
            ):
                if order == _MARK:
                    yield key, None
                elif reason is not None:
                    yield (
                        key,
                        DeadLetter(topic=TOPICS[order], partition=0, offset=offset, reason=reason, payload=payload),
                    )
                elif frame:
                    yield key, routed((REPLAY_CLOCK, (order, 0, offset), _frame(payload), None))
                else:
                    yield (
                        key,
                        routed((REPLAY_CLOCK, (order, 0, offset), decode(TOPICS[order], payload, 0, offset), payload)),
                    )
