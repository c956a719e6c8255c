"""What production throws at it: floods, skewed clocks, a scheduler that is down."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import msgspec
import polars as pl

from tests.conftest import DEMO_DIR, replay
from tests.support import slurm_scenarios as scenarios
from tests.support.slurm_cluster import SlurmCluster
from tests.support.slurm_scenarios import settings as slurm_settings
from trainguard.actions.audit import read_entries
from trainguard.datasets.records import job_record, log_record
from trainguard.detectors.crash import MAX_HELD, CrashDetector
from trainguard.detectors.events import LogRecord

NCCL = (
    "[rank{r}]:[E1201 10:21:00.123456 ProcessGroupNCCL.cpp:607] [Rank {r}] Watchdog caught collective operation "
    "timeout: WorkNCCL(SeqNum=812, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600007 "
    "milliseconds before timing out."
)


def test_a_flood_of_cascade_lines_from_a_1000_node_job_becomes_one_anomaly(tmp_path: Path):
    nodes = [f"gpu-node-{i:04d}" for i in range(1000)]
    t0 = 1_796_205_600.0
    sched = [job_record(t0, "77", "RUNNING", nodes)]
    progress = [
        {"ts": t0 + s, "job_id": "77", "node": nodes[0], "rank": 0, "step": s, "step_time_s": 1.0} for s in range(60)
    ]
    # Every one of the 8,000 ranks prints its watchdog timeout ten times within ten seconds.
    logs = [
        log_record(t0 + 60 + k + (r % 1000) / 1000, "77", nodes[r // 8], r, NCCL.format(r=r))
        for k in range(10)
        for r in range(8000)
    ]
    sched.append(job_record(t0 + 75, "77", "FAILED", nodes, exit_code=1))
    tmp_path.mkdir(exist_ok=True)
    for topic, records in (("scheduler", sched), ("progress", progress), ("logs", logs)):
        (tmp_path / f"{topic}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    result = replay(tmp_path)
    assert not result.dead
    (anomaly,) = [a for a in result.anomalies if not a.resolved]
    assert (anomaly.kind, anomaly.category, anomaly.layer, anomaly.transient) == (
        "crash",
        "nccl_timeout",
        "system",
        True,
    )
    assert len(anomaly.nodes) == 1000 and len(anomaly.evidence) <= 12
    assert [a.action for a in result.actions] == ["requeue_job"]  # no drain: nothing blames a node


def test_held_cascade_lines_are_bounded():
    crash = CrashDetector(cascade_hold_s=10.0)
    for r in range(20_000):
        rec = LogRecord(ts=100.0 + r / 1000, job_id="1", node=f"n{r // 8}", rank=r, source="app", line=NCCL.format(r=r))
        assert crash.observe(rec) == []
    assert len(crash._held) == MAX_HELD  # the rest are counted, not kept
    (finding,) = crash.advance(200.0)
    assert len(finding.nodes) == 2500 and "20000 cascade line(s)" in finding.evidence[-1]


def test_skewed_node_clocks_still_name_the_right_node_and_job(tmp_path: Path):
    """gpu-node-04 (the Xid 79) runs 2 minutes fast, gpu-node-06 (the hang) 2 minutes slow."""
    for topic in ("logs", "progress", "gpu", "scheduler"):
        frame = pl.read_parquet(DEMO_DIR / f"{topic}.parquet")
        if frame.schema["ts"] == pl.Utf8:
            frame = frame.with_columns(pl.col("ts").str.to_datetime(time_zone="UTC").dt.epoch("us") / 1e6)
        if "node" in frame.columns:
            skew = pl.when(pl.col("node") == "gpu-node-04").then(120.0).when(pl.col("node") == "gpu-node-06")
            frame = frame.with_columns(pl.col("ts") + skew.then(-120.0).otherwise(0.0))
        frame.sort("ts").write_parquet(tmp_path / f"{topic}.parquet")
    shutil.copy(DEMO_DIR / "labels.jsonl", tmp_path / "labels.jsonl")
    result = replay(tmp_path)
    assert not result.dead
    found = {(a.kind, a.category, a.job_id, tuple(a.nodes)) for a in result.anomalies}
    # The crashed job is flagged (its progress stops), the fast node's Xid 79 is still blamed on it,
    # the slow node's hang is found, and nothing else is drained.
    assert any(kind == "hang" and job == "1002" for kind, _, job, _ in found)
    assert ("node_unhealthy", "xid_79", None, ("gpu-node-04",)) in found
    assert ("hang", "no_progress", "1003", ("gpu-node-06",)) in found
    drains = {a.target for a in result.actions if a.action == "drain_node" and a.status == "recommended"}
    assert drains == {"gpu-node-04", "gpu-node-10"}


def test_a_scheduler_that_is_down_fails_actions_after_retries_and_detection_goes_on(
    slurm: SlurmCluster, tmp_path: Path
):
    job, nodes = slurm.submit(nodes=2)
    slurm.stop_controller()
    try:
        settings = slurm_settings(tmp_path)
        settings.scheduler.timeout_s = 2.0
        result = replay(scenarios.xid79(tmp_path / "scenario", job, nodes, nodes[1]), settings)
    finally:
        slurm.start_controller()
    (crash,) = result.anomalies
    assert crash.category == "xid_79"
    assert [(a.action, a.status) for a in result.actions] == [("drain_node", "failed"), ("requeue_job", "failed")]
    assert all("cannot read the scheduler inventory" in a.reason for a in result.actions)
    failed = [e for e in read_entries(tmp_path / "audit.jsonl") if e["event"] == "failed"]
    assert len(failed) == 2 and all(len(e["attempts"]) == 2 and not e["attempts"][-1]["ok"] for e in failed)
    assert msgspec.json.encode(failed)  # the audit entries are plain JSON
