"""One way to build and run trainguard's flow: live from Kafka, a replay, or in-process.

The CLI, ``python -m bytewax.run "trainguard.dataflows.flow:from_env()"``, the benchmarks,
the soaks, the notebooks and the tests all go through these functions, which use Bytewax's
public API only (``bytewax.testing.run_main`` / ``cluster_main`` run a flow in this process).

>>> from trainguard.cli.common import DEMO_DIR
>>> found = replay_in_process(DEMO_DIR)
>>> sorted({a.kind for a in found.anomalies})
['crash', 'hang', 'node_unhealthy', 'straggler']
"""

from __future__ import annotations

import gc
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

from bytewax.dataflow import Dataflow
from bytewax.recovery import RecoveryConfig, init_db_dir
from bytewax.testing import cluster_main, run_main

from trainguard.actions.records import Action
from trainguard.dataflows.config import Settings
from trainguard.dataflows.flow import Outputs, build_flow
from trainguard.dataflows.kafka_io import InputTopics, KafkaRecordMapper
from trainguard.detectors.events import Anomaly, DeadLetter

__all__ = ["Collected", "LiveFlow", "live_flow", "replay_flow", "replay_in_process", "run"]


@dataclass
class Collected:
    """What an in-process run produced, in output order (anomaly records include resolutions)."""

    anomalies: list[Anomaly] = field(default_factory=list)
    actions: list[Action] = field(default_factory=list)
    dead_letters: list[DeadLetter] = field(default_factory=list)

    def __iter__(self):
        return iter((self.anomalies, self.actions, self.dead_letters))


@dataclass
class LiveFlow:
    """The live flow and what its callers watch: the record mapper (lag) and the input topics."""

    flow: Dataflow
    mapper: KafkaRecordMapper
    inputs: InputTopics


def live_flow(settings: Settings, outputs: Outputs, stopping: threading.Event | None = None) -> LiveFlow:
    """The flow over the Kafka input topics (``ConfigError`` when none can be found).

    ``stopping``: set it to end the input cleanly (a SIGTERM): held lines are released and
    the sinks flushed before the run returns.
    """
    from trainguard.dataflows.kafka_io import LiveKafkaSource, check_topics

    inputs = check_topics(settings.kafka)
    mapper = KafkaRecordMapper(settings.kafka)
    flow = build_flow(
        LiveKafkaSource(settings.kafka, inputs.topics, stopping),
        settings,
        outputs,
        live=True,
        record_mapper=mapper,
        clock_partitions=inputs.clock_partitions,
        drain_reports=True,
    )
    return LiveFlow(flow, mapper, inputs)


def replay_flow(
    directory: Path, settings: Settings, outputs: Outputs, speed: float | None = None, live: bool = False
) -> Dataflow:
    """The flow over a replay directory (``ReplayError`` when it holds nothing readable)."""
    from trainguard.dataflows.replay import ReplaySource

    return build_flow(ReplaySource(directory, speed=speed), settings, outputs, live=live)


NO_SNAPSHOTS_S = 10 * 365 * 24 * 3600.0

# The engine allocates records, frames and tuples by the million, nearly all short-lived, beside a large
# heap of detector state that changes slowly. CPython's default (a young collection every 700 net
# allocations) spent about a fifth of a GPU-heavy replay in the collector; collecting 70 times less often
# gives the same peak memory (docs/benchmarks.md). Reference counting still frees almost everything at once.
ENGINE_GC_THRESHOLD = (50_000, 20, 20)
# A replay's reader thread (``replay_columns.read_ahead``) lets go of the interpreter for each call into
# polars and must then wait for the flow to hand it back, up to the switch interval each time (5 ms by
# default): with 1 ms the flow waited for blocks ~0.1 s instead of ~0.3 s on a GPU-only replay of 1.44 M
# records. The flow's own thread gives it up a little more often; an engine process has no other busy thread.
ENGINE_SWITCH_INTERVAL_S = 0.001


@contextmanager
def engine_runtime() -> Iterator[None]:
    """The engine's garbage-collection thresholds and thread switch interval while a flow runs; the
    previous ones after."""
    before, switch = gc.get_threshold(), sys.getswitchinterval()
    gc.set_threshold(*ENGINE_GC_THRESHOLD)
    sys.setswitchinterval(ENGINE_SWITCH_INTERVAL_S)
    try:
        yield
    finally:
        gc.set_threshold(*before)
        sys.setswitchinterval(switch)


def run(
    flow: Dataflow,
    workers: int = 1,
    recovery: Path | None = None,
    snapshot_s: float = 10.0,
    addresses: list[str] | None = None,
    process_id: int = 0,
) -> None:
    """Run ``flow`` on ``workers`` worker threads, snapshotting to ``recovery`` if given; with
    ``addresses``, as process ``process_id`` of a cluster of processes (Bytewax's ``-a``/``-i``)."""
    recovery_config = None
    if recovery is not None:
        if not any(recovery.glob("part-*.sqlite3")):
            recovery.mkdir(parents=True, exist_ok=True)
            init_db_dir(recovery, 1)
        recovery_config = RecoveryConfig(recovery)
    # Bytewax snapshots every touched key at each epoch's end, recovery or not: without recovery the
    # snapshots go nowhere, so epochs are made long enough never to end before the input does.
    epoch = timedelta(seconds=snapshot_s if recovery_config is not None else NO_SNAPSHOTS_S)
    with engine_runtime():
        if addresses and len(addresses) > 1:
            cluster_main(
                flow,
                addresses,
                process_id,
                epoch_interval=epoch,
                recovery_config=recovery_config,
                worker_count_per_proc=workers,
            )
        elif workers == 1:
            run_main(flow, epoch_interval=epoch, recovery_config=recovery_config)
        else:
            cluster_main(
                flow, [], 0, epoch_interval=epoch, recovery_config=recovery_config, worker_count_per_proc=workers
            )


def replay_in_process(
    directory: Path,
    settings: Settings | None = None,
    archive: Path | None = None,
    speed: float | None = None,
    live: bool = False,
) -> Collected:
    """Replay ``directory`` through the real flow in this process and collect its outputs (tests, notebooks)."""
    out = Collected()
    outputs = Outputs(
        archive=archive,
        on_anomalies=out.anomalies.extend,
        on_actions=out.actions.extend,
        on_dead_letters=out.dead_letters.extend,
    )
    run(replay_flow(directory, settings or Settings(), outputs, speed=speed, live=live))
    return out
