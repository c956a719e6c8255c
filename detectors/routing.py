"""Key events by job, join node-level events to jobs, and drive the event-time clock.

The router sees every event once. It holds events in a reorder buffer until
the watermark passes them and releases them in timestamp order, so a Kafka
consumer that reads its topics at different speeds processes exactly what a
time-ordered replay processes, in the same order. It keeps the scheduler's
job → nodes map so GPU samples and kernel lines (which carry only a node) are
stamped with the job running there, refuses timestamps far off the clock, and
after each release hands out the ticks the clock has crossed to every active
key — in the same output stream as the events, so a key never sees a tick
before an event that preceded it.

>>> from trainguard.detectors.events import JobEvent, GpuSample
>>> router = Router(RouterSettings(lateness_s=0, tick_s=5))
>>> [(k, type(v).__name__) for k, v in router.route(
...     "scheduler/0", JobEvent(ts=100.0, job_id="7", state="RUNNING", nodes=["n1"]))]
[('job/7', 'JobEvent'), ('job/7', 'Tick')]
>>> [(k, type(v).__name__) for k, v in router.route("scheduler/0", GpuSample(ts=106.0, node="n9", gpu=0))]
[('job/7', 'Tick'), ('node/n9', 'GpuSample')]

The 105 s tick comes before the 106 s sample it does not cover. Node keys get
every ``node_tick_every``-th tick only: they have no short deadlines. A node's GPU
samples of one instant go on as one :class:`~trainguard.detectors.frames.GpuFrame`:

>>> out = router.route_batch([("scheduler/0", (2, 0, i), GpuSample(ts=111.0, node="n1", gpu=i), None)
...                            for i in range(8)])
>>> [(k, type(v).__name__) for k, v in out], out[1][1].gpus
([('job/7', 'Tick'), ('job/7', 'GpuFrame')], (0, 1, 2, 3, 4, 5, 6, 7))

**Shards.** To spread the work over many workers, ``shards`` routers each own the
jobs whose id hashes to them (:func:`shard_of`) and the idle nodes whose name does.
Records that carry a job go to their owner only; records that carry just a node
(GPU samples, kernel lines, node states) and the scheduler's job records go to
every shard, because each one needs the whole job ↔ node map to decide whether a
node's record is its own. A :class:`Heartbeat` tells every shard how far each
input stream has got, so all their clocks move together. A job's events and ticks
therefore still come from one router, in the same order as with one shard. A
sender that already knows each node record's shard (a time-merged replay does)
gives it to that shard alone and says so in its heartbeats (``nodes_broadcast``).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable
from operator import itemgetter
from typing import Any

import msgspec

from trainguard.detectors import job_states
from trainguard.detectors.clock import EventClock
from trainguard.detectors.events import (
    TOPICS,
    DeadLetter,
    Event,
    GpuSample,
    JobEvent,
    NodeEvent,
    ProgressRecord,
    Tick,
)
from trainguard.detectors.frames import GpuFrame, same_sweep
from trainguard.detectors.settings import Count, Positive, Seconds

# Shard ownership and the job ↔ node map live in detectors.shards; the names stay importable here
# (and Router snapshots written before the split, which pickled JobPlacement from this module, resume).
from trainguard.detectors.shards import Drained, Heartbeat, JobPlacement, is_broadcast, shard_of

__all__ = ["DEAD", "Heartbeat", "JobPlacement", "Router", "RouterSettings", "is_broadcast", "shard_of"]

DEAD = "!dead"  # key of dead-letter items in the router's output


# An event in the reorder buffer: (ts, (topic index, partition, offset), arrival number, event).
_Waiting = tuple[float, tuple[int, int, int], int, Event]


class RouterSettings(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    lateness_s: Seconds = 2.0
    tick_s: Positive = 5.0
    node_tick_every: Count = 6  # nodes have no short deadlines: tick them every 30 s
    idle_after_s: float | None = None  # live mode: wall seconds before a silent source stops holding the clock
    max_future_s: float = 3600.0  # ahead of the newest event (and of the wall clock, live)
    max_late_s: float = 3600.0  # behind the watermark
    key_idle_s: float = 3600.0  # stop ticking keys silent this long (event time)
    linger_s: float = 600.0  # keep ticking a finished job this long
    shards: Count = 1  # routers to spread jobs over (use the number of workers)


class Router:
    """Stateful router: one instance sees the whole stream, or one shard of it (see the module notes)."""

    def __init__(
        self,
        settings: RouterSettings | None = None,
        partitions: list[str] | None = None,
        wall: float | None = None,
        sharded: bool = False,
        drain_reports: bool = False,
    ) -> None:
        """``sharded``: this router is one of several and learns which from its first :class:`Heartbeat`.

        ``drain_reports``: the live sources say when a partition has drained (:class:`Drained`),
        and a silent partition holds the clock back until its source says so.
        """
        self.settings = s = settings or RouterSettings()
        self.clock = EventClock(s.lateness_s, s.tick_s, s.idle_after_s, drain_reports=drain_reports)
        # Until every source partition has spoken (or, live, gone quiet) the
        # clock cannot know how far time has moved.
        for partition in partitions or []:
            self.clock.expect(partition, wall)
        self.placement = JobPlacement()
        self.node_job = self.placement.node_job  # the same dict, read on every node record
        self.active: dict[str, float] = {}  # key -> last event ts
        self.ended: dict[str, float] = {}  # job key -> end ts
        # Reorder buffer: events wait here until the watermark passes them, so every run processes them
        # in the same (timestamp, topic, offset) order. Kept sorted: a batch joins it in one sort (of two
        # runs, nearly: linear), and what the watermark passed leaves as one slice.
        self._buffer: list[_Waiting] = []
        self._seq = 0
        self.shard, self.shards = 0, 1  # set by the first Heartbeat when the flow is sharded
        self.nodes_broadcast = True
        self.misrouted = 0
        # A shard releases nothing before it knows which shard it is (else it would keep everything).
        self._named = not sharded

    def __setstate__(self, state: dict[str, Any]) -> None:
        # A snapshot taken by an earlier version (before placements and shard naming)
        # still resumes: an upgrade must not cost the recovery directory.
        if "placement" not in state:
            placement = JobPlacement()
            placement.node_job = state.setdefault("node_job", {})
            placement.job_nodes = state.pop("job_nodes", {})
            state["placement"] = placement
        state.setdefault("nodes_broadcast", True)
        state.setdefault("misrouted", 0)
        state.setdefault("_named", True)
        state["_buffer"].sort()  # (a heap, in snapshots taken before it was kept sorted)
        self.__dict__.update(state)

    def route(
        self,
        partition: str,
        event: Event,
        wall: float | None = None,
        order: tuple[int, int, int] = (0, 0, 0),
        payload: bytes | None = None,
    ) -> list[tuple[str, Any]]:
        """Take one event; return the ``(key, item)`` pairs now due (see :meth:`route_batch`)."""
        return self.route_batch([(partition, order, event, payload)], wall)

    def route_batch(
        self, batch: list[tuple[str, tuple[int, int, int], Event, bytes | None]], wall: float | None = None
    ) -> list[tuple[str, Any]]:
        """Take ``(clock partition, order, event, original bytes)`` items; return what is now due.

        ``order`` — (topic index, partition, offset) — breaks ties between equal
        timestamps the same way in every run. The output interleaves released
        events and ticks in time order, so it does not depend on how the input
        was batched.
        """
        out: list[tuple[str, Any]] = []
        clock = self.clock
        observe = clock.observe
        arrived: list[_Waiting] = []
        push = arrived.append
        max_future, max_late, wall_limit = self._bounds(wall)
        for partition, order, event, payload in batch:
            if type(event) is Drained:
                if wall is not None:
                    clock.drained(partition, wall)
                continue
            ts: float = event.ts  # type: ignore[assignment]
            if type(event) is Heartbeat:
                self.shard, self.shards, self.nodes_broadcast = event.shard, event.shards, event.nodes_broadcast
                self._named = True
                # Within the bounds an event must keep: a heartbeat carrying another
                # shard's far-off record must not drag this clock along.
                newest = clock.max_ts
                if (
                    ts >= clock.current - max_late
                    and ts <= wall_limit
                    and (newest == -math.inf or ts <= newest + max_future)
                ):
                    observe(partition, ts, wall)
                continue
            # Fast path: inside every bound (the common case) needs no message.
            if ts <= clock.max_ts + max_future and ts <= wall_limit and ts >= clock.current - max_late:
                observe(partition, ts, wall)
                self._seq += 1
                push((ts, order, self._seq, event))
                continue
            self._arrive_out_of_bounds(partition, order, event, payload, ts, wall, out, push)
        return self._settle(arrived, wall, out)

    def route_window(
        self, records: list[tuple[float, int, int, Any, bytes | None]], partition: str, wall: float | None = None
    ) -> list[tuple[str, Any]]:
        """:meth:`route_batch` for a replay's records as its merge ordered them — ``(sort key, topic index,
        offset, event or the decoder's dead letter, original bytes)``, all of the one ordered stream
        ``partition`` — without a tuple per record to say so. The decoder's dead letters come first in what it
        returns, as the flow would pass them on before routing the rest."""
        dead: list[tuple[str, Any]] = []
        out: list[tuple[str, Any]] = []
        clock = self.clock
        observe = clock.observe
        arrived: list[_Waiting] = []
        push = arrived.append
        max_future, max_late, wall_limit = self._bounds(wall)
        for _key, topic, offset, event, payload in records:
            if type(event) is DeadLetter:
                dead.append((DEAD, event))
                continue
            ts: float = event.ts  # type: ignore[assignment]
            if ts <= clock.max_ts + max_future and ts <= wall_limit and ts >= clock.current - max_late:
                observe(partition, ts, wall)
                self._seq += 1
                push((ts, (topic, 0, offset), self._seq, event))
                continue
            self._arrive_out_of_bounds(partition, (topic, 0, offset), event, payload, ts, wall, out, push)
        out = self._settle(arrived, wall, out)
        return dead + out if dead else out

    def _bounds(self, wall: float | None) -> tuple[float, float, float]:
        """``(max_future_s, max_late_s, the latest timestamp the wall clock allows)``, for the routing loops."""
        max_future = self.settings.max_future_s
        return max_future, self.settings.max_late_s, math.inf if wall is None else wall + max_future

    def _settle(self, arrived: list[_Waiting], wall: float | None, out: list[tuple[str, Any]]) -> list[tuple[str, Any]]:
        """The events that arrived join the reorder buffer; ``out`` gets what the watermark now releases."""
        if arrived:
            self._wait(arrived)
        if self._named:
            out.extend(self._release(self.clock.watermark(wall)))
        return out

    def _arrive_out_of_bounds(
        self,
        partition: str,
        order: tuple[int, int, int],
        event: Event,
        payload: bytes | None,
        ts: float,
        wall: float | None,
        out: list[tuple[str, Any]],
        push: Callable[[_Waiting], None],
    ) -> None:
        """An event outside the fast path's bounds: refused (a dead letter per record in ``out``), or let in."""
        reason = self._refuse(ts, wall)
        if reason is not None and self.shard and self._sent_to_all(event):
            return  # every shard refuses it: shard 0 reports it
        if reason is not None:
            topic = TOPICS[order[0]] if order[0] < len(TOPICS) else partition.split("/", 1)[0]
            # The bytes as they came (a sweep record too); a frame the replay reader cut from its rows
            # has none: each of its GPUs' records is refused, at its own offset, as it would be alone.
            if payload is not None:
                records: list[tuple[int, bytes]] = [(order[2], payload)]
            elif type(event) is GpuFrame:
                records = [(order[2] + i, msgspec.json.encode(s)) for i, s in enumerate(event.samples())]
            else:
                records = [(order[2], msgspec.json.encode(event))]
            for offset, raw in records:
                dead = DeadLetter(topic=topic, partition=order[1], offset=offset, reason=reason, payload=raw, ts=ts)
                out.append((DEAD, dead))
            return
        self.clock.observe(partition, ts, wall)
        self._seq += 1
        push((ts, order, self._seq, event))

    def _wait(self, arrived: list[_Waiting]) -> None:
        """Put events in the reorder buffer, in order (``seq`` is unique: events themselves are never compared)."""
        buffer = self._buffer
        if len(arrived) * 8 >= len(buffer):
            buffer += arrived
            buffer.sort()
        else:  # a few events into a long buffer: each in its place
            for item in arrived:
                bisect.insort(buffer, item)

    def idle(self, wall: float) -> list[tuple[str, Any]]:
        """Live mode, no input: let the clock move, release what is due, hand out ticks."""
        return self._release(self.clock.watermark(wall)) if self._named else []

    def finish(self) -> list[tuple[str, Any]]:
        """End of a finite input: everything has arrived; release it all, tick to the newest event,
        then tell every active key that the input ended (a final :class:`Tick`)."""
        watermark = self.clock.finish()
        out = self._release(watermark)
        if self._named:
            final = Tick(watermark, final=True)
            out.extend((key, final) for key in self.active)
        return out

    @property
    def buffered(self) -> int:
        return len(self._buffer)

    # -- internals -------------------------------------------------------------------
    def _refuse(self, ts: float, wall: float | None) -> str | None:
        s = self.settings
        if self.clock.max_ts != -math.inf and ts > self.clock.max_ts + s.max_future_s:
            return f"`ts` is {ts - self.clock.max_ts:.0f}s ahead of the newest event (limit {s.max_future_s:g}s)"
        if wall is not None and ts > wall + s.max_future_s:
            return f"`ts` is {ts - wall:.0f}s ahead of the wall clock (limit {s.max_future_s:g}s)"
        watermark = self.clock.current
        if ts < watermark - s.max_late_s:
            return f"`ts` is {watermark - ts:.0f}s behind the watermark (limit {s.max_late_s:g}s)"
        return None

    def _key(self, event: Event) -> str:
        if type(event) is ProgressRecord:  # most records: a job's own (its id is required)
            return f"job/{event.job_id}"
        if isinstance(event, JobEvent):
            job = str(event.job_id)
            self._job_state(job, event)
            return f"job/{job}"
        if isinstance(event, NodeEvent):
            event.job_id = self.node_job.get(event.node)
            return f"node/{event.node}"
        # A GPU sample joins the job on its node: the job compares its GPUs with each
        # other, and a GPU fault under a job is part of that job's incident.
        event.job_id = job = self.placement.job_for(event)
        return f"node/{event.node}" if job is None else f"job/{job}"

    def _owns(self, key: str) -> bool:
        # "job/<id>" or "node/<name>": idle nodes are spread too (their GPU samples are most of the stream).
        return shard_of(key[4:] if key[0] == "j" else key[5:], self.shards) == self.shard

    def _sent_to_all(self, event: Event) -> bool:
        return isinstance(event, JobEvent | NodeEvent) or (self.nodes_broadcast and is_broadcast(event))

    def _job_state(self, job: str, event: JobEvent) -> None:
        self.placement.apply(event)
        now = job_states.phase(event.state)
        if now == "running":
            self.ended.pop(f"job/{job}", None)
        elif now == "ended":  # waiting (requeued, held, suspended): it will run again, keep ticking it
            self.ended[f"job/{job}"] = event.ts  # type: ignore[assignment]

    def _release(self, watermark: float) -> list[tuple[str, Any]]:
        """Events up to the watermark in timestamp order, each tick right after the events it covers."""
        out: list[tuple[str, Any]] = []
        buffer = self._buffer
        points = self.clock.grid_points(watermark, buffer[0][0] if buffer else None)
        next_point = 0
        active = self.active
        sweeps = False  # whether out holds sweeps to turn into frames
        cut = bisect.bisect_right(buffer, watermark, key=_TS)
        due = buffer[:cut]
        del buffer[:cut]
        # (Locals: this loop runs once per event.)
        next_tick = points[0] if points else math.inf
        sharded, never = self.shards > 1, -math.inf
        for ts, _order, _seq, event in due:
            if next_tick < ts:
                upto = next_point
                while upto < len(points) and points[upto] < ts:
                    upto += 1
                out.extend(self._ticks(points[next_point:upto]))
                next_point = upto
                next_tick = points[upto] if upto < len(points) else math.inf
            key = self._key(event)
            if sharded and not self._owns(key):
                if not self._sent_to_all(event):
                    self.misrouted += 1  # sent here alone, yet another shard's: the sender's placement disagreed
                continue  # another shard's job (or node): it routes this event
            if ts > active.get(key, never):
                active[key] = ts
            if type(event) is GpuSample:
                # A node's GPUs report together: consecutive samples of one node and instant go on as one frame.
                last = out[-1][1] if out else None
                if type(last) is _Sweep and last.joins(event, key):
                    last.samples.append(event)
                    continue
                out.append((key, _Sweep(key, event)))
                sweeps = True
                continue
            out.append((key, event))
        out.extend(self._ticks(points[next_point:]))
        if sweeps:
            out = [(k, v.frame() if type(v) is _Sweep else v) for k, v in out]
        return out

    def _ticks(self, points: list[float]) -> list[tuple[str, Any]]:
        if not points:
            return []
        s = self.settings
        out: list[tuple[str, Any]] = []
        for point in points:
            # On the absolute grid, so every run ticks nodes at the same instants.
            tick_nodes = round(point / s.tick_s) % s.node_tick_every == 0
            tick = Tick(point)
            for key in self.active:
                if tick_nodes or key.startswith("job/"):
                    out.append((key, tick))
        self._evict(points[-1])
        return out

    def _evict(self, watermark: float) -> None:
        s = self.settings
        stale = [
            key
            for key, last in self.active.items()
            if watermark > last + s.key_idle_s
            or (key in self.ended and watermark > self.ended[key] + s.linger_s + s.tick_s)
        ]
        for key in stale:
            del self.active[key]
            self.ended.pop(key, None)


_TS = itemgetter(0)


class _Sweep:
    """GPU samples of one node at one instant, on their way to becoming a :class:`GpuFrame`."""

    __slots__ = ("key", "samples")

    def __init__(self, key: str, sample: GpuSample) -> None:
        self.key = key
        self.samples = [sample]

    def joins(self, sample: GpuSample, key: str) -> bool:
        first = self.samples[0]
        gpus = [s.gpu for s in self.samples]
        return key == self.key and same_sweep(sample.ts, sample.node, sample.gpu, first.ts, first.node, gpus)  # type: ignore[arg-type]

    def frame(self) -> GpuFrame | GpuSample:
        return GpuFrame.from_samples(self.samples) if len(self.samples) > 1 else self.samples[0]
