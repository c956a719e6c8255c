"""Who owns what when the router is split over shards, and which job runs on which node.

Each of ``shards`` routers owns the jobs whose id hashes to it (:func:`shard_of`) and the
idle nodes whose name does. Records that name no job, or change the job ↔ node map
(:func:`is_broadcast`), reach every shard; a :class:`Heartbeat` tells every shard how far
each input stream has got, and a :class:`Drained` that a live stream has nothing more to give.
:class:`JobPlacement` is the scheduler's job ↔ node map that stamps node-level records
(GPU samples, kernel lines) with the job running there.
"""

from __future__ import annotations

import zlib

import msgspec

from trainguard.detectors import job_states
from trainguard.detectors.events import Event, GpuSample, JobEvent, LogRecord, NodeEvent, ProgressRecord
from trainguard.detectors.frames import GpuFrame


class Drained(msgspec.Struct, frozen=True, gc=False):
    """A live input partition has delivered all its broker holds (its consumer is at the high watermark).

    Only a drained partition may stop holding the clock back when it falls silent (see
    :class:`~trainguard.detectors.clock.EventClock`); it reaches every shard.
    """


class Heartbeat(msgspec.Struct, frozen=True, gc=False):
    """An input stream reached ``ts``; tells shard ``shard`` of ``shards`` (which learns its place from it).

    ``nodes_broadcast``: node records (GPU samples, node-only log lines) reach every
    shard, which keeps its own; otherwise the sender gave each to its owner only.
    """

    ts: float
    shard: int
    shards: int
    nodes_broadcast: bool = True


def shard_of(job_id: str, shards: int) -> int:
    """The router shard that owns a job: a hash stable across processes and runs.

    >>> shard_of("1002", 1), shard_of("1002", 2), shard_of("1002", 2) == shard_of("1002", 2)
    (0, 1, True)
    """
    return zlib.crc32(job_id.encode()) % shards if shards > 1 else 0


def is_broadcast(event: Event | GpuFrame) -> bool:
    """Whether every shard needs this event (it names no job, or it changes the job ↔ node map)."""
    return (
        type(event) is GpuFrame
        or isinstance(event, GpuSample | NodeEvent | JobEvent)
        or (isinstance(event, LogRecord) and event.job_id is None)
    )


class JobPlacement:
    """Which job runs on which node, as of the last scheduler job record applied.

    >>> placement = JobPlacement()
    >>> placement.apply(JobEvent(ts=1.0, job_id="7", state="RUNNING", nodes=["n1", "n2"]))
    >>> placement.node_job["n2"]
    '7'
    >>> placement.apply(JobEvent(ts=9.0, job_id="7", state="COMPLETED"))
    >>> placement.node_job
    {}
    """

    def __init__(self) -> None:
        self.node_job: dict[str, str] = {}
        self.job_nodes: dict[str, list[str]] = {}

    def apply(self, event: JobEvent) -> None:
        job = str(event.job_id)
        if job_states.phase(event.state) == "running":
            if event.nodes:
                self.job_nodes[job] = list(event.nodes)
                for node in event.nodes:
                    self.node_job[node] = job
            return
        # Any other state: the job no longer occupies its nodes.
        for node in self.job_nodes.pop(job, []):
            if self.node_job.get(node) == job:
                del self.node_job[node]

    def job_for(self, event: LogRecord | ProgressRecord | GpuSample | GpuFrame) -> str | None:
        """The job a record belongs to: its own, or — for a GPU sample or a line without a
        job — the job running on its node (``None``: the node is idle, the record is the node's).

        >>> placement = JobPlacement()
        >>> placement.apply(JobEvent(ts=1.0, job_id="7", state="RUNNING", nodes=["n1"]))
        >>> [placement.job_for(GpuSample(ts=2.0, node=node, gpu=0)) for node in ("n1", "n2")]
        ['7', None]
        """
        if type(event) is GpuSample or type(event) is GpuFrame or event.job_id is None:
            return self.node_job.get(event.node)
        return event.job_id  # type: ignore[return-value]
