"""Router shards spread jobs over workers without changing a single output."""

from __future__ import annotations

import threading
from pathlib import Path

import bytewax.operators as op
import pytest
from bytewax.dataflow import Dataflow
from bytewax.inputs import DynamicSource, StatelessSourcePartition
from bytewax.operators import StatefulBatchLogic

from tests.conftest import DEMO_DIR, replay, summary
from trainguard.dataflows.config import Settings
from trainguard.dataflows.flow import Outputs, build_flow
from trainguard.dataflows.pipeline import run
from trainguard.dataflows.placement import key_on_worker, worker_of
from trainguard.dataflows.processes import WorkerProcessError, run_processes
from trainguard.dataflows.records import Routed
from trainguard.dataflows.replay import ReplaySource, merged_events
from trainguard.dataflows.replay_shards import ShardedReplaySource, shard_events
from trainguard.datasets import generator
from trainguard.detectors.events import TOPICS, Anomaly, DeadLetter, GpuSample, JobEvent, NodeEvent, ProgressRecord
from trainguard.detectors.routing import DEAD, Router, RouterSettings
from trainguard.detectors.shards import Heartbeat, shard_of


def sharded(shards: int) -> Settings:
    settings = Settings()
    settings.router.shards = shards
    return settings


@pytest.fixture(scope="module")
def scenario(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("scenario")
    generator.write_scenario("default", 7, directory, minutes=20)
    return directory


@pytest.mark.parametrize("shards", [2, 3])
def test_shards_change_nothing_on_one_worker(shards: int, scenario: Path):
    one, many = replay(scenario), replay(scenario, settings=sharded(shards))
    assert len(one.anomalies) > 10
    assert summary(many.stream) == summary(one.stream)
    assert sorted(a.action_id for a in many.actions) == sorted(a.action_id for a in one.actions)


def test_two_workers_with_two_shards_match_one(scenario: Path):
    anomalies: list[Anomaly] = []
    flow = build_flow(ReplaySource(scenario), sharded(2), Outputs(on_anomalies=anomalies.extend))
    run(flow, workers=2)
    assert summary(anomalies) == summary(replay(scenario).stream)


def test_the_demo_is_the_same_with_shards():
    assert summary(replay(DEMO_DIR, settings=sharded(2)).stream) == summary(replay(DEMO_DIR).stream)


def test_each_shard_keeps_its_own_jobs_and_only_shard_0_reports_refusals():
    jobs = [str(j) for j in range(1000, 1010)]
    owners = {job: shard_of(job, 2) for job in jobs}
    assert set(owners.values()) == {0, 1}
    routers = [Router(RouterSettings(lateness_s=0, tick_s=5, shards=2)) for _ in range(2)]
    for shard, router in enumerate(routers):
        router.route_batch([("s/0", (9, 0, 0), Heartbeat(100.0, shard, 2), None)])
    keys: list[set[str]] = [set(), set()]
    for shard, router in enumerate(routers):
        for i, job in enumerate(jobs):
            node = f"n{i}"
            for ev in (
                JobEvent(ts=101.0, job_id=job, state="RUNNING", nodes=[node]),
                GpuSample(ts=102.0, node=node, gpu=0),
            ):
                keys[shard].update(k for k, _ in router.route("s/0", ev))
            if owners[job] == shard:  # job-carrying records reach their owner only
                keys[shard].update(
                    k for k, _ in router.route("s/0", ProgressRecord(ts=103.0, job_id=job, node=node, rank=0, step=1))
                )
        keys[shard].update(k for k, _ in router.route("s/0", GpuSample(ts=104.0, node="idle-node", gpu=0)))
        far = router.route("s/0", GpuSample(ts=99_999.0, node="n0", gpu=0))
        keys[shard].update(k for k, _ in far)
    for shard in (0, 1):
        mine = {f"job/{j}" for j, owner in owners.items() if owner == shard}
        assert {k for k in keys[shard] if k.startswith("job/")} == mine
    idle_owner = shard_of("idle-node", 2)
    assert "node/idle-node" in keys[idle_owner] and "node/idle-node" not in keys[1 - idle_owner]
    assert DEAD in keys[0] and DEAD not in keys[1]


# ---------------------------------------------------------------- one shard per worker process


class _Probe(StatelessSourcePartition):
    """Worker 0 sends every key once; each worker says which thread it is."""

    def __init__(self, worker: int, keys: list[str], threads: dict[str, int]) -> None:
        self.worker, self.keys, self.threads, self.done = worker, keys, threads, False

    def next_batch(self) -> list[tuple[str, str]]:
        if self.done:
            raise StopIteration
        self.done = True
        self.threads[f"worker {self.worker}"] = threading.get_ident()
        return [(k, k) for k in self.keys] if self.worker == 0 else []


class _Remember(StatefulBatchLogic):
    def __init__(self, threads: dict[str, int]) -> None:
        self.threads = threads

    def on_batch(self, values: list[str]) -> tuple[list[str], bool]:
        self.threads[values[0]] = threading.get_ident()
        return [], StatefulBatchLogic.DISCARD

    def snapshot(self) -> None:
        return None


@pytest.mark.parametrize("workers", [2, 3])
def test_bytewax_gives_each_key_to_the_worker_placement_predicts(workers: int):
    keys = [f"job/{j}" for j in range(40)] + [key_on_worker("router", w, workers) for w in range(workers)]
    threads: dict[str, int] = {}

    class Source(DynamicSource):
        def build(self, step_id: str, worker_index: int, worker_count: int) -> _Probe:
            return _Probe(worker_index, keys, threads)

    flow = Dataflow("placement")
    kept = op.stateful_batch("keep", op.input("in", flow, Source()), lambda _: _Remember(threads))
    op.inspect("sink", kept, lambda *_: None)
    run(flow, workers=workers)
    worker_of_thread = {threads[f"worker {w}"]: w for w in range(workers)}
    placed = {key: worker_of_thread[threads[key]] for key in keys}
    assert placed == {key: worker_of(key, workers) for key in keys}
    assert {placed[key_on_worker("router", w, workers)] for w in range(workers)} == set(range(workers))
    assert len(set(placed.values())) == workers  # the job keys really are spread


def _record_id(item: Routed | DeadLetter) -> tuple[int, int]:
    return (TOPICS.index(item.topic), item.offset) if isinstance(item, DeadLetter) else (item[1][0], item[1][2])


@pytest.mark.parametrize("shards", [2, 3])
def test_each_record_of_a_replay_is_kept_by_the_shard_that_routes_it(shards: int, scenario: Path):
    kept = [[item for _, item in shard_events(scenario, shard, shards) if item is not None] for shard in range(shards)]
    ids = [{_record_id(item) for item in items} for items in kept]
    for _, item in merged_events(scenario):
        holders = [shard for shard in range(shards) if _record_id(item) in ids[shard]]
        if isinstance(item, DeadLetter):
            assert holders == [0]
        elif isinstance(item[2], JobEvent | NodeEvent):
            assert holders == list(range(shards))
        else:
            assert len(holders) == 1, item
    # and each router keeps all it was given: nothing refused as another shard's
    for shard in range(shards):
        router = Router(RouterSettings(shards=shards))
        items = [item for item in kept[shard] if type(item) is Routed]
        router.route_batch([("replay/0", (9, 0, 0), Heartbeat(items[0][2].ts, shard, shards, False), None), *items])
        router.finish()
        assert router.misrouted == 0


def test_worker_processes_each_with_their_shard_match_one_worker(scenario: Path):
    one = replay(scenario)
    anomalies: list[Anomaly] = []
    actions: list = []
    dead: list = []
    outputs = Outputs(on_anomalies=anomalies.extend, on_actions=actions.extend, on_dead_letters=dead.extend)
    run_processes(lambda o: build_flow(ShardedReplaySource(scenario), Settings(), o), 2, outputs, timeout_s=300)
    assert len(one.anomalies) > 10
    assert summary(anomalies) == summary(one.stream)
    assert sorted(a.action_id for a in actions) == sorted(a.action_id for a in one.actions)
    assert len(dead) == len(one.dead)


def test_a_worker_process_that_fails_fails_the_run_with_its_reason():
    def broken(outputs: Outputs) -> Dataflow:
        raise RuntimeError("no flow today")

    with pytest.raises(WorkerProcessError, match=r"worker process \d failed: RuntimeError: no flow today"):
        run_processes(broken, 2, Outputs(), timeout_s=60)


def test_a_shard_holds_what_it_gets_before_its_first_heartbeat():
    # A batch split in transit can hand a shard records before the heartbeat that names it.
    job = next(str(j) for j in range(1000, 1100) if shard_of(str(j), 2) == 1)
    other = next(str(j) for j in range(1000, 1100) if shard_of(str(j), 2) == 0)
    router = Router(RouterSettings(lateness_s=0, tick_s=5), sharded=True)
    early = [
        ("s/0", (3, 0, 0), JobEvent(ts=100.0, job_id=job, state="RUNNING", nodes=["a"]), None),
        ("s/0", (3, 0, 1), JobEvent(ts=100.0, job_id=other, state="RUNNING", nodes=["b"]), None),
        ("s/0", (2, 0, 0), GpuSample(ts=101.0, node="a", gpu=0), None),
        ("s/0", (2, 0, 1), GpuSample(ts=101.0, node="b", gpu=0), None),
    ]
    assert router.route_batch(early) == []
    released = router.route_batch([("s/0", (9, 0, 0), Heartbeat(101.0, 1, 2), None)])
    assert {key for key, _ in released} == {f"job/{job}"}


def test_worker_processes_dead_letter_garbage_once_and_lose_nothing(tmp_path: Path):
    for path in DEMO_DIR.glob("*.parquet"):
        (tmp_path / path.name).write_bytes(path.read_bytes())
    garbage = {
        "logs": [
            b"{not json",
            b'{"ts": 1796205600, "node": 3, "line": "x"}',
            b'{"ts": 1796205600000, "node": "n", "line": "ms"}',
        ],
        "gpu": [b'{"ts": "yesterday", "node": "gpu-node-01", "gpu": 0}', b"\x00\xffjunk"],
        "progress": [b'{"ts": 1796205600, "node": "gpu-node-01", "rank": 0, "step": 1}'],  # no job_id
        "scheduler": [b'{"kind": "job", "ts": 1796205600, "state": "RUNNING"}'],
    }
    for topic, lines in garbage.items():
        (tmp_path / f"{topic}.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    one = replay(tmp_path)
    anomalies: list[Anomaly] = []
    dead: list[DeadLetter] = []
    outputs = Outputs(on_anomalies=anomalies.extend, on_dead_letters=dead.extend)
    run_processes(lambda o: build_flow(ShardedReplaySource(tmp_path), Settings(), o), 2, outputs, timeout_s=300)
    assert len(one.dead) == sum(len(lines) for lines in garbage.values())
    assert sorted((d.topic, d.payload, d.reason) for d in dead) == sorted(
        (d.topic, d.payload, d.reason) for d in one.dead
    )
    assert summary(anomalies) == summary(one.stream) == summary(replay(DEMO_DIR).stream)
