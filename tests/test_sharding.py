"""Router shards spread jobs over workers without changing a single output."""

from __future__ import annotations

from pathlib import Path

import pytest
from bytewax._bytewax import cli_main

from dataflows.config import Settings
from dataflows.flow import Outputs, build_flow
from dataflows.replay import ReplaySource
from datasets import generator
from detectors.events import Anomaly, GpuSample, JobEvent, ProgressRecord
from detectors.routing import DEAD, Heartbeat, Router, RouterSettings, shard_of
from tests.conftest import DEMO_DIR, replay


def summary(anomalies: list[Anomaly]) -> list[tuple]:
    return sorted(
        (a.anomaly_id, a.kind, a.category, a.layer, a.job_id, tuple(a.nodes), round(a.detected_at, 3))
        for a in anomalies
    )


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
    assert summary(many.anomalies) == summary(one.anomalies)
    assert sorted(a.action_id for a in many.actions) == sorted(a.action_id for a in one.actions)


def test_two_workers_with_two_shards_match_one(scenario: Path):
    anomalies: list[Anomaly] = []
    flow = build_flow(ReplaySource(scenario), sharded(2), Outputs(on_anomalies=anomalies.extend))
    cli_main(flow, workers_per_process=2)
    assert summary(anomalies) == summary(replay(scenario).anomalies)


def test_the_demo_is_the_same_with_shards():
    assert summary(replay(DEMO_DIR, settings=sharded(2)).anomalies) == summary(replay(DEMO_DIR).anomalies)


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
    assert "node/idle-node" in keys[0] and "node/idle-node" not in keys[1]
    assert DEAD in keys[0] and DEAD not in keys[1]
