"""One worker's share of a replay, for multi-process runs: worker ``i`` keeps router shard ``i``.

A record belongs to the shard whose router keys it: a job's records to
``shard_of(job)``; a GPU sample or a node's own log line to the shard of the job
running on that node at that moment (or of the node, when idle); scheduler
records to every shard, since each router needs the whole job ↔ node map.

Each worker reads and decodes the whole replay and keeps its share. Reading the
bytes for the job or node instead, to skip decoding the others' records, was
measured slower: msgspec decodes a record in under a microsecond, less than the
Python it would take to avoid it. Node records are placed with the scheduler
records read so far — the order the router releases records in, since a replay
is merged by time — so each router receives exactly the records it would have
kept from the whole stream (a scheduler record out of order in its file could
place a few samples by the old map; the router counts any it refuses in
``misrouted``).
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

from bytewax.inputs import DynamicSource, StatelessSourcePartition

from trainguard.dataflows.placement import key_on_worker
from trainguard.dataflows.records import Routed, routed
from trainguard.dataflows.replay import REPLAY_CLOCK, _merge, _Paced, _topic_chunks, replay_directory, topic_files
from trainguard.detectors.events import DeadLetter, JobEvent, NodeEvent
from trainguard.detectors.shards import Heartbeat, JobPlacement, shard_of


def shard_events(directory: Path, shard: int, shards: int) -> Iterator[tuple[float, Routed | DeadLetter | None]]:
    """The records of ``replay.merged_events`` that shard ``shard`` of ``shards`` keeps, in the same order.

    ``(key, None)`` now and then says how far the whole stream got past the last kept
    record. Scheduler records go to every shard, dead letters to shard 0.
    """
    placement = JobPlacement()
    owners: dict[str, int] = {}  # shard_of, remembered: a few thousand jobs and nodes, ~10⁵ records each
    for window in _merge([_topic_chunks(t, fs, decoded=True) for t, fs in topic_files(directory).items()]):
        kept: list[tuple[float, Routed | DeadLetter | None]] = []
        for key, order, offset, event, payload in window:
            cls = type(event)
            if cls is DeadLetter:
                if shard == 0:
                    kept.append((key, event))
                continue
            if cls is JobEvent:
                placement.apply(event)
            elif cls is not NodeEvent:
                job = placement.job_for(event) or event.node  # the router keys it by its job, or by an idle node
                owner = owners.get(job)
                if owner is None:
                    owner = owners[job] = shard_of(job, shards)
                if owner != shard:
                    continue
            kept.append((key, routed((REPLAY_CLOCK, (order, 0, offset), event, payload))))
        if not kept or kept[-1][0] != window[-1][0]:
            kept.append((window[-1][0], None))  # how far the whole stream got
        yield from kept


class _ShardPartition(StatelessSourcePartition[tuple[str, Routed | DeadLetter]]):
    """One worker's share of a replay, keyed for its own router, with a heartbeat per batch."""

    def __init__(self, paced: _Paced, shard: int, shards: int) -> None:
        self._paced = paced
        self._shard, self._shards = shard, shards
        self._key = key_on_worker("router", shard, shards)

    def next_batch(self) -> list[tuple[str, Routed | DeadLetter]]:
        batch = self._paced.next_batch()
        key = self._key
        out: list[tuple[str, Routed | DeadLetter]] = [(key, item) for item in batch if item is not None]
        if batch:
            # How far the whole stream got, including the records other shards kept,
            # so every shard's clock moves as one router's would.
            heartbeat = Heartbeat(self._paced.newest, self._shard, self._shards, nodes_broadcast=False)
            out.append((key, (REPLAY_CLOCK, (9, 0, 0), heartbeat, None)))  # type: ignore[arg-type]
        return out

    def next_awake(self) -> datetime | None:
        return self._paced.awake


class ShardedReplaySource(DynamicSource[tuple[str, Routed | DeadLetter]]):
    """A replay split over the workers of a multi-process run: worker ``i`` keeps router shard ``i``.

    Each worker emits its share (:func:`shard_events`) already keyed for its own
    router, with a key Bytewax places on this very worker (:mod:`dataflows.placement`),
    so nothing crosses between processes until anomalies do. A worker's share keeps
    no offsets, so it does not resume: use it for replays, and the Kafka source with
    ``--recovery`` in production.
    """

    def __init__(self, directory: str | Path, speed: float | None = None, batch_size: int = 2000) -> None:
        from trainguard.dataflows.replay_split import is_split

        path = Path(directory)
        # A directory split by shard (``trainguard split-replay``) holds no topic files of its own.
        self.directory = replay_directory(directory, speed, split=is_split(path))
        self.speed = speed
        self.batch_size = batch_size

    def build(self, step_id: str, worker_index: int, worker_count: int) -> _ShardPartition:
        from trainguard.dataflows.replay_split import shard_folder, split_events

        folder = shard_folder(self.directory, worker_index, worker_count)
        records = shard_events(self.directory, worker_index, worker_count) if folder is None else split_events(folder)
        return _ShardPartition(_Paced(records, self.speed, self.batch_size, None), worker_index, worker_count)
