"""The trainguard dataflow: sources → decode → route by job → detect → policy → sinks.

::

    input ─► decode ─┬─► route (one router: clock, job↔node map, ticks) ─► detect (keyed by job/node)
                     │            └─► dead letters                                   │
                     └─► dead letters     anomalies sinks ◄─┬── attribute (history) ◄─┘
                                                            └─► decide (policy) ─► execute (driver) ─► actions sinks

Build it with :func:`build_flow` and run it the Bytewax way
(``python -m bytewax.run "trainguard.dataflows.flow:from_env()"``) or through the CLI.
"""

from __future__ import annotations

import copy
import itertools
import math
import os
import pickle
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import bytewax.operators as op
from bytewax.dataflow import Dataflow
from bytewax.inputs import Source
from bytewax.operators import StatefulBatchLogic
from bytewax.outputs import DynamicSink, StatelessSinkPartition

from trainguard.actions.executor import ActionExecutor
from trainguard.actions.policy import Policy
from trainguard.actions.records import Action
from trainguard.dataflows import metrics
from trainguard.dataflows.action_step import ActionLogic, PolicyLogic, make_executor
from trainguard.dataflows.archive import ParquetArchiveSink
from trainguard.dataflows.config import Settings, load_settings
from trainguard.dataflows.placement import key_on_worker
from trainguard.dataflows.records import REPLAY_CLOCK, RawRecord, ReplayWindow, Routed
from trainguard.dataflows.replay_shards import ShardedReplaySource
from trainguard.dataflows.snapshots import restore
from trainguard.detectors.describe import described
from trainguard.detectors.events import (
    TOPICS,
    Anomaly,
    DeadLetter,
    Event,
    GpuSample,
    LogRecord,
    NodeEvent,
    Tick,
    decode,
)
from trainguard.detectors.frames import GpuFrame
from trainguard.detectors.history import HistoryAttributor
from trainguard.detectors.monitor import JobMonitor, NodeMonitor
from trainguard.detectors.routing import DEAD, Router
from trainguard.detectors.settings import DetectorSettings
from trainguard.detectors.shards import Drained, Heartbeat, is_broadcast, shard_of
from trainguard.detectors.signatures import use_site_signatures

# ---------------------------------------------------------------- stateful steps


# What reaches the router: a decoded record or dead letter, or a replay's batch of them as one item.
_Arriving = Routed | DeadLetter | list[Routed | DeadLetter] | ReplayWindow


class RouterLogic(StatefulBatchLogic[_Arriving, tuple[str, Any], bytes]):
    """Bytewax shell around :class:`Router`; live mode also ticks on wall-clock idle."""

    def __init__(self, router: Router, live: bool) -> None:
        self.router = router
        self.live = live

    def on_batch(self, values: list[_Arriving]) -> tuple[list[Any], bool]:
        started = time.perf_counter()
        wall = time.time() if self.live else None
        kinds = {type(v) for v in values}
        if kinds == {ReplayWindow}:  # a full-speed replay's merged records, as they are
            windows: list[ReplayWindow] = values  # type: ignore[assignment]
            records = windows[0].records if len(windows) == 1 else [r for w in windows for r in w.records]
            out = self.router.route_window(records, REPLAY_CLOCK, wall)
        else:
            if list in kinds or ReplayWindow in kinds:  # a replay's batches travel as one item each
                values = _flat(values)
            dead = [(DEAD, v) for v in values if type(v) is DeadLetter]  # refused by the decoder: pass them on
            out = self.router.route_batch([v for v in values if type(v) is not DeadLetter] if dead else values, wall)  # type: ignore[arg-type]
            if dead:
                out = dead + out
        self._observe(started, wall)
        return self._placed(out), StatefulBatchLogic.RETAIN

    def _placed(self, out: list[tuple[str, Any]]) -> list[tuple[str, Any]]:
        """Each key's items as one list, in their order — one item for Bytewax to route per key and release,
        not one per event — with a shard's keys renamed so Bytewax keeps them on this shard's worker (see
        ``placement``). Dead letters stay one by one."""
        dead: list[tuple[str, Any]] = []
        groups: dict[str, list[Any]] = {}
        for key, item in out:
            if key == DEAD:
                dead.append((key, item))
                continue
            group = groups.get(key)
            if group is None:
                groups[key] = [item]
            else:
                group.append(item)
        shard, shards = self.router.shard, self.router.shards
        if shards == 1:
            return dead + list(groups.items())
        return dead + [(key_on_worker(key, shard, shards), group) for key, group in groups.items()]

    def _observe(self, started: float, wall: float | None) -> None:
        metrics.ROUTE_SECONDS.observe(time.perf_counter() - started)
        metrics.BUFFERED.set(self.router.buffered)
        if wall is not None and self.router.clock.current != float("-inf"):
            metrics.WATERMARK_DELAY.set(wall - self.router.clock.current)
        metrics.mark_progress()

    def on_notify(self) -> tuple[list[tuple[str, Any]], bool]:
        started, wall = time.perf_counter(), time.time()
        out = self.router.idle(wall)
        self._observe(started, wall)
        return self._placed(out), StatefulBatchLogic.RETAIN

    def on_eof(self) -> tuple[list[tuple[str, Any]], bool]:
        # A finite input has ended: everything has arrived. (Live sources never end.)
        return self._placed(self.router.finish()), StatefulBatchLogic.RETAIN

    def notify_at(self) -> datetime | None:
        return datetime.now(UTC) + timedelta(seconds=0.5) if self.live else None

    def snapshot(self) -> bytes:
        # Pickled now, so later mutation cannot leak into the snapshot (and far cheaper than deepcopy).
        return pickle.dumps(self.router, protocol=pickle.HIGHEST_PROTOCOL)


class MonitorLogic(StatefulBatchLogic[Any, Anomaly, bytes]):
    """Bytewax shell around one key's :class:`JobMonitor` or :class:`NodeMonitor`."""

    def __init__(self, monitor: JobMonitor | NodeMonitor | None, settings: DetectorSettings) -> None:
        self.monitor = monitor
        self.settings = settings

    def on_batch(self, values: list[Any]) -> tuple[list[Anomaly], bool]:
        started = time.perf_counter()
        try:
            return self._on_batch(values)
        finally:
            metrics.DETECT_SECONDS.observe(time.perf_counter() - started)

    def _on_batch(self, values: list[list[Any]]) -> tuple[list[Anomaly], bool]:
        """``values``: lists of the key's events and ticks, in order (see ``RouterLogic._placed``)."""
        out: list[Anomaly] = []
        for item in itertools.chain.from_iterable(values):
            if type(item) is Tick:
                if self.monitor is None:
                    continue
                out.extend(self.monitor.advance(item.watermark))
                if item.final:
                    out.extend(self.monitor.end_of_input(item.watermark))
                if self.monitor.finished(item.watermark):
                    self.monitor = None  # done with: a later event of this key starts afresh
                continue
            if self.monitor is None:
                self.monitor = _new_monitor(item, self.settings)
            out.extend(self.monitor.observe(item))
        return out, (StatefulBatchLogic.DISCARD if self.monitor is None else StatefulBatchLogic.RETAIN)

    def snapshot(self) -> bytes:
        return pickle.dumps(self.monitor, protocol=pickle.HIGHEST_PROTOCOL)


class HistoryLogic(StatefulBatchLogic[Anomaly, Anomaly, bytes]):
    """Bytewax shell around the cluster-wide :class:`HistoryAttributor` (anomalies are rare: one is enough)."""

    def __init__(self, history: HistoryAttributor) -> None:
        self.history = history

    def on_batch(self, values: list[Anomaly]) -> tuple[list[Anomaly], bool]:
        ordered = sorted(values, key=lambda a: (a.detected_at, a.anomaly_id))  # same order whatever the batching
        return [self.history.revise(a) for a in ordered], StatefulBatchLogic.RETAIN

    def snapshot(self) -> bytes:
        return pickle.dumps(self.history, protocol=pickle.HIGHEST_PROTOCOL)


class _Unjudged(StatefulBatchLogic[Any, Anomaly, bytes]):
    """The detect step with the detectors switched off: a key's events reach it and go no further."""

    def __init__(self, _state: bytes | None = None) -> None:
        pass

    def on_batch(self, values: list[Any]) -> tuple[list[Anomaly], bool]:
        return [], StatefulBatchLogic.RETAIN

    def snapshot(self) -> bytes:
        return b""


def _new_monitor(event: Event, settings: DetectorSettings) -> JobMonitor | NodeMonitor:
    job = getattr(event, "job_id", None)
    node_only = type(event) is GpuFrame or isinstance(event, GpuSample | NodeEvent)
    if node_only or (isinstance(event, LogRecord) and job is None):
        return NodeMonitor(event.node, settings)
    return JobMonitor(str(job), settings)


# ---------------------------------------------------------------- small sinks


class _CallbackPartition(StatelessSinkPartition[Any]):
    def __init__(self, fn: Callable[[list[Any]], None]) -> None:
        self._fn = fn

    def write_batch(self, items: list[Any]) -> None:
        self._fn(items)


class CallbackSink(DynamicSink[Any]):
    """Hands each output batch to a function (in-process runs: console, counters, tests)."""

    def __init__(self, fn: Callable[[list[Any]], None]) -> None:
        self.fn = fn

    def build(self, step_id: str, worker_index: int, worker_count: int) -> _CallbackPartition:
        return _CallbackPartition(self.fn)


# ---------------------------------------------------------------- the flow


@dataclass
class Outputs:
    """Where results go. Callbacks only make sense in single-process runs."""

    archive: Path | None = None
    kafka: bool = False
    on_anomalies: Callable[[list[Anomaly]], None] | None = None
    on_actions: Callable[[list[Action]], None] | None = None
    on_dead_letters: Callable[[list[DeadLetter]], None] | None = None
    # Builds the action executor (default: from the settings' policy, scheduler and audit log).
    executor: Callable[[], ActionExecutor] | None = None


_TOPIC_ORDER = {t: i for i, t in enumerate(TOPICS)}
_TOPIC_COUNT = len(TOPICS)


def _decode_batch(batch: list[RawRecord | _Arriving]) -> list[tuple[str, _Arriving]]:
    """Decode a batch for the router; replay sources hand over records they already decoded (a whole batch of
    them as one item, which goes on as one)."""
    out: list[tuple[str, _Arriving]] = []
    counts = [0] * _TOPIC_COUNT  # events per topic, for the metrics
    for rec in batch:
        if type(rec) is ReplayWindow:  # a full-speed replay's merged records, decoded by the source
            for _, topic, _, event, _ in rec.records:
                if type(event) is not DeadLetter and topic < _TOPIC_COUNT:
                    counts[topic] += len(event) if type(event) is GpuFrame else 1  # a frame: its records
            out.append(("router", rec))
            continue
        if type(rec) is list or type(rec) is Routed:  # decoded by the source (replay), or a drain report
            for item in rec if type(rec) is list else (rec,):
                if type(item) is Routed and (topic := item[1][0]) < _TOPIC_COUNT:
                    counts[topic] += len(item.event) if type(item.event) is GpuFrame else 1  # a frame: its records
            out.append(("router", rec))
            continue
        if isinstance(rec, DeadLetter):
            out.append(("router", rec))
            continue
        event = decode(rec.topic, rec.payload, rec.partition, rec.offset)
        if isinstance(event, DeadLetter):
            out.append(("router", event))
        else:
            topic = _TOPIC_ORDER.get(rec.topic, 9)
            out.append(("router", Routed(rec.clock, (topic, rec.partition, rec.offset), event, rec.payload)))
            if topic < _TOPIC_COUNT:
                counts[topic] += 1
    for topic, n in enumerate(counts):
        if n:
            metrics.EVENTS.labels(TOPICS[topic]).inc(n)
    return out


def _flat(values: list[_Arriving]) -> list[Routed | DeadLetter]:
    """Records and batches of records as records, in order."""
    out: list[Routed | DeadLetter] = []
    for value in values:
        if type(value) is list:
            out += value
        elif type(value) is ReplayWindow:
            out += value.routed()
        else:
            out.append(value)  # type: ignore[arg-type]
    return out


def _sharder(
    shards: int,
) -> Callable[[list[tuple[str, _Arriving]]], list[tuple[str, Any]]]:
    """Send each decoded record to the router shard that owns its job, or to every shard (see ``routing``)."""
    # Shard i's key lives on worker i when there are as many workers as shards.
    keys = [key_on_worker("router", i, shards) for i in range(shards)]

    def shard(batch: list[tuple[str, _Arriving]]) -> list[tuple[str, Any]]:
        out: list[tuple[str, Any]] = []
        progress: dict[str, float] = {}
        for rec in _flat([rec for _, rec in batch]):
            if type(rec) is DeadLetter:
                out.append((keys[0], rec))  # a dead letter: reported once
                continue
            event = rec.event
            if type(event) is Drained:  # every shard's clock waits on every partition
                out.extend((key, rec) for key in keys)
                continue
            if event.ts > progress.get(rec.clock, -math.inf):  # type: ignore[operator]
                progress[rec.clock] = event.ts  # type: ignore[assignment]
            if is_broadcast(event):
                out.extend((key, rec) for key in keys)
            else:
                out.append((keys[shard_of(str(event.job_id), shards)], rec))
        # Heartbeats last: each shard learns its index, and how far every stream got — after
        # the records they cover, so a batch split in transit never moves a clock past them.
        out.extend(
            (keys[i], Routed(clock, (9, 0, 0), Heartbeat(ts, i, shards), None))
            for clock, ts in progress.items()
            for i in range(shards)
        )
        return out

    return shard


def build_flow(
    source: Source[Any],
    settings: Settings,
    outputs: Outputs,
    *,
    live: bool = False,
    record_mapper: Callable[[Any], RawRecord | DeadLetter] | None = None,
    clock_partitions: list[str] | None = None,
    drain_reports: bool = False,
    detect: bool = True,
) -> Dataflow:
    """Wire the whole pipeline over ``source`` (a replay or Kafka source).

    ``clock_partitions`` names every ordered input stream (Kafka topic-partitions)
    so the watermark waits for all of them; a replay is one stream. ``drain_reports``:
    the source says when a partition has drained (see ``kafka_io.LiveKafkaSource``).
    ``detect=False`` hands each key's events to a step that drops them: what reading,
    ordering, routing and Bytewax cost without the detectors (``trainguard bench replay --run bare``).
    """
    det = settings.detectors
    use_site_signatures(det.signatures)  # in every process that builds the flow, before any line is read
    router_settings = copy.deepcopy(settings.router)
    router_settings.linger_s = det.linger_s
    if live and router_settings.idle_after_s is None:
        router_settings.idle_after_s = 2.0
    if not live:
        router_settings.idle_after_s = None

    flow = Dataflow("trainguard")
    raw = op.input("input", flow, source)
    if record_mapper is not None:
        raw = op.map("to_records", raw, record_mapper)
    sharded = isinstance(source, ShardedReplaySource) or router_settings.shards > 1
    if isinstance(source, ShardedReplaySource):
        keyed = raw  # each worker's share, decoded and keyed for its own router shard
    else:
        # Decoded events and dead letters alike go to the one router (keyed "router"), which
        # passes the dead letters through: one fewer per-item step on the hot path.
        keyed = op.flat_map_batch("decode", raw, _decode_batch)
        if router_settings.shards > 1:
            keyed = op.flat_map_batch("shard", keyed, _sharder(router_settings.shards))
    router_out = op.stateful_batch(
        "route",
        keyed,
        lambda state: RouterLogic(  # type: ignore[arg-type]
            restore(state)
            if state
            else Router(router_settings, clock_partitions, time.time() if live else None, sharded, drain_reports),
            live,
        ),
    )
    # Like key_rm and branch, but a Python call per batch (one for each side) instead of one per event.
    alive = op.flat_map_batch("routed", router_out, lambda batch: [kv for _, kv in batch if kv[0] != DEAD])
    dead = op.flat_map_batch("dead_letters", router_out, lambda batch: [kv[1] for _, kv in batch if kv[0] == DEAD])
    anomalies = op.key_rm(
        "anomalies",
        op.stateful_batch(
            "detect",
            alive,
            (lambda state: MonitorLogic(restore(state) if state else None, det)) if detect else _Unjudged,  # type: ignore[arg-type]
        ),
    )
    hs = det.history
    anomalies = op.key_rm(
        "attributed",
        op.stateful_batch(
            "attribute",
            op.key_on("to_history", anomalies, lambda _: "history"),
            lambda state: HistoryLogic(
                restore(state)
                if state
                else HistoryAttributor(hs.lemon_jobs, hs.repeat_on_gpu, hs.window_s, hs.repeat_window_s)
            ),
        ),
    )
    runbook = settings.notify.runbook_url
    anomalies = op.map("describe", anomalies, lambda a: described(a, runbook))
    decisions = op.key_rm(
        "decided",
        op.stateful_batch(
            "decide",
            op.key_on("to_policy", anomalies, lambda _: "policy"),
            lambda state: PolicyLogic(restore(state) if state else Policy(settings.policy)),
        ),
    )
    new_executor = outputs.executor or (lambda: make_executor(settings))
    actions = op.key_rm(
        "executed",
        op.stateful_batch(
            "execute",
            op.key_on("to_executor", decisions, lambda _: "actions"),
            lambda state: ActionLogic(new_executor(), restore(state) if state else None),
        ),
    )

    op.output(
        "metrics_anomalies",
        anomalies,
        CallbackSink(metrics.count_anomalies),
    )
    op.output(
        "metrics_actions",
        actions,
        CallbackSink(lambda items: metrics.count_by(metrics.ACTIONS, ((a.action, a.status) for a in items))),
    )
    op.output(
        "metrics_late",
        dead,
        CallbackSink(lambda items: metrics.count_by(metrics.DEAD_LETTERS, ((d.topic,) for d in items))),
    )
    if settings.notify.enabled:
        from trainguard.dataflows.notify_step import NotifySink

        to_notify = op.merge("to_notify", anomalies, actions)
        op.output("notify", to_notify, NotifySink(settings.notify, settings.audit_log, settings.silences_path))
    if outputs.archive is not None:
        a = settings.archive
        for name, stream in (("anomalies", anomalies), ("actions", actions), ("dead_letter", dead)):
            keyed_rows = op.key_on(f"archive_key_{name}", stream, lambda _, name=name: name)
            op.output(f"archive_{name}", keyed_rows, ParquetArchiveSink(outputs.archive, name, a.roll_rows, a.roll_s))
    if outputs.kafka:
        from trainguard.dataflows.kafka_io import kafka_sink, to_kafka_message

        ks = settings.kafka
        out = op.merge("kafka_out", anomalies, actions, dead)
        op.output("kafka", op.map("to_kafka", out, lambda x: to_kafka_message(ks, x)), kafka_sink(ks))
    for name, stream, fn in (
        ("anomalies", anomalies, outputs.on_anomalies),
        ("actions", actions, outputs.on_actions),
        ("dead_letters", dead, outputs.on_dead_letters),
    ):
        if fn is not None:
            op.output(f"callback_{name}", stream, CallbackSink(fn))
    return flow


def from_env() -> Dataflow:
    """Build the live Kafka flow from environment variables, for ``python -m bytewax.run``.

    ``TRAINGUARD_CONFIG`` (YAML), ``TRAINGUARD_BROKERS`` (comma-separated) and
    ``TRAINGUARD_OUT`` (archive directory) are read.
    """
    import gc

    from trainguard.dataflows.pipeline import ENGINE_GC_THRESHOLD, live_flow

    gc.set_threshold(*ENGINE_GC_THRESHOLD)  # this process runs the engine and nothing else
    settings = load_settings(os.environ.get("TRAINGUARD_CONFIG"))
    if os.environ.get("TRAINGUARD_BROKERS"):
        settings.kafka.brokers = os.environ["TRAINGUARD_BROKERS"].split(",")
    out = os.environ.get("TRAINGUARD_OUT")
    return live_flow(settings, Outputs(archive=Path(out) if out else None, kafka=True)).flow
