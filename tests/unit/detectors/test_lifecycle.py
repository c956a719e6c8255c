"""The anomaly lifecycle: open → resolved, and one alarm never blinds the next."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.support.paths import FIXTURES
from trainguard.actions.executor import ActionExecutor
from trainguard.actions.policy import Policy, PolicyConfig
from trainguard.dataflows.action_step import ActionLogic, PolicyLogic
from trainguard.dataflows.archive import read_dataset
from trainguard.datasets.scoring import score
from trainguard.detectors.events import Anomaly, GpuSample, JobEvent, LogRecord, NodeEvent, ProgressRecord
from trainguard.detectors.monitor import JobMonitor, NodeMonitor

XID79 = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=python, GPU has fallen off the bus."


def _stepping(mon: JobMonitor, start: float, steps: range, dt: float = 2.0) -> list[Anomaly]:
    out = []
    for step in steps:
        out += mon.observe(ProgressRecord(ts=start + step * dt, job_id="7", node="n1", rank=0, step=step))
        out += mon.advance(start + step * dt)
    return out


def _tick(mon: JobMonitor, start: float, end: float) -> list[Anomaly]:
    out = []
    t = start
    while t <= end:
        out += mon.advance(t)
        t += 5.0
    return out


def test_a_hang_alarm_resolved_by_progress_does_not_blind_the_next_fault() -> None:
    mon = JobMonitor("7")
    mon.observe(JobEvent(ts=0.0, job_id="7", state="RUNNING", nodes=["n1"]))
    assert _stepping(mon, 0.0, range(1, 30)) == []
    alarm = _tick(mon, 60.0, 140.0)  # a logs-only silence of 80 s: a hang, as far as anyone can tell
    assert [a.category for a in alarm] == ["no_progress"]
    resumed = _stepping(mon, 150.0 - 30 * 2.0, range(30, 40))
    assert [(a.anomaly_id, a.resolution) for a in resumed] == [(alarm[0].anomaly_id, "progress resumed after 92 s")]
    # Ten minutes later a GPU falls off the bus: it is news, with its own id.
    crash = mon.observe(LogRecord(ts=800.0, job_id="7", node="n1", source="kernel", line=XID79))
    assert [(a.category, a.resolved) for a in crash] == [("xid_79", False)]
    assert crash[0].anomaly_id != alarm[0].anomaly_id


def test_a_root_cause_after_a_hang_alarm_is_reported_and_explains_it() -> None:
    mon = JobMonitor("7")
    mon.observe(JobEvent(ts=0.0, job_id="7", state="RUNNING", nodes=["n1"]))
    _stepping(mon, 0.0, range(1, 30))
    (hang,) = _tick(mon, 60.0, 140.0)
    found = mon.observe(LogRecord(ts=150.0, job_id="7", node="n1", source="kernel", line=XID79))
    assert [(a.kind, a.category, a.resolution) for a in found] == [
        ("hang", "no_progress", f"explained by {found[1].anomaly_id}"),
        ("crash", "xid_79", None),
    ]
    ended = mon.observe(JobEvent(ts=200.0, job_id="7", state="FAILED", nodes=["n1"], exit_code=1))
    assert [(a.anomaly_id, a.resolution) for a in ended] == [(found[1].anomaly_id, "job ended (FAILED)")]
    # A restart resolves nothing more, and the job's next fault is new.
    assert mon.observe(JobEvent(ts=300.0, job_id="7", state="RUNNING", nodes=["n1"])) == []
    again = mon.observe(LogRecord(ts=400.0, job_id="7", node="n1", source="kernel", line=XID79))
    assert [a.category for a in again] == ["xid_79"] and again[0].anomaly_id != found[1].anomaly_id
    assert hang.kind == "hang"


def test_the_hardware_fault_under_an_application_error_is_reported_and_explains_it() -> None:
    """A GPU that falls off the bus makes the job's CUDA calls fail first; the kernel's line comes after."""
    mon = JobMonitor("7")
    first = mon.observe(
        LogRecord(ts=10.0, job_id="7", node="n1", rank=0, line="RuntimeError: CUDA error: unspecified launch failure")
    )
    found = mon.observe(LogRecord(ts=10.5, job_id="7", node="n1", source="kernel", line=XID79))
    assert [(a.category, a.layer) for a in first] == [("cuda_launch_failure", "application")]
    assert [(a.category, a.layer, a.resolution) for a in found] == [
        ("cuda_launch_failure", "application", f"explained by {found[1].anomaly_id}"),
        ("xid_79", "hardware", None),
    ]
    # ... and never the other way round: an application error after a lost GPU is its evidence.
    assert (
        mon.observe(LogRecord(ts=11.0, job_id="7", node="n1", rank=1, line="CUDA error: an illegal memory access"))
        == []
    )


@pytest.mark.parametrize(("exception_rank", "reported"), [(0, False), (None, False), (3, True)])
def test_an_exception_the_job_logged_and_stepped_past_is_no_crash(exception_rank: int | None, reported: bool) -> None:
    """A handled exception logged at ERROR, then the same rank steps on: nothing. Another rank's exception
    stays: that rank may be dead while rank 0 takes its last steps."""
    mon = JobMonitor("7")
    _stepping(mon, 0.0, range(1, 10))
    line = "2024-01-01 10:00:00,000 - ERROR - ConnectionError: HTTPSConnectionPool: Read timed out. Retrying."
    found = mon.observe(LogRecord(ts=19.0, job_id="7", node="n1", rank=exception_rank, line=line))
    found += _stepping(mon, 0.0, range(10, 20))
    found += _tick(mon, 40.0, 60.0)
    assert [a.category for a in found if a.kind == "crash"] == (["python_exception"] if reported else [])


def test_a_node_that_returns_to_service_resolves_its_outage() -> None:
    node = NodeMonitor("n9")
    (down,) = node.observe(NodeEvent(ts=10.0, node="n9", state="DOWN*", reason="Not responding"))
    assert node.observe(NodeEvent(ts=20.0, node="n9", state="DOWN")) == []  # one anomaly per outage
    assert node.observe(NodeEvent(ts=30.0, node="n9", state="DRAINED")) == []  # still out of service
    (back,) = node.observe(NodeEvent(ts=40.0, node="n9", state="IDLE"))
    assert (back.anomaly_id, back.resolution, back.resolved_at) == (down.anomaly_id, "node returned to service", 40.0)


def test_a_false_alarm_leaves_no_requeue_waiting_for_an_operator() -> None:
    mon = JobMonitor("7")
    mon.observe(JobEvent(ts=0.0, job_id="7", state="RUNNING", nodes=["n1"]))
    _stepping(mon, 0.0, range(1, 30))
    (hang,) = _tick(mon, 60.0, 140.0)
    (resolution,) = _stepping(mon, 90.0, range(30, 32))
    policy = PolicyLogic(Policy(PolicyConfig()))
    actions = ActionLogic(ActionExecutor(PolicyConfig(), None, None))
    decided, _ = policy.on_batch([hang])
    (diagnose, recommended), _ = actions.on_batch(decided)
    assert (recommended.action, recommended.status) == ("requeue_job", "recommended")
    assert (diagnose.action, diagnose.status) == ("diagnose", "applied")  # read-only: done, nothing to withdraw
    withdrawn, _ = policy.on_batch([resolution])
    (suppressed,), _ = actions.on_batch(withdrawn)
    assert (suppressed.action_id, suppressed.status) == (recommended.action_id, "suppressed")
    assert "progress resumed" in suppressed.reason


def test_the_scorer_counts_hangs_that_progress_resolved_as_false_alarms() -> None:
    opened = {
        "anomaly_id": "a1",
        "kind": "hang",
        "category": "no_progress",
        "job_id": "7",
        "nodes": [],
        "detected_at": 100.0,
        "resolved_at": None,
    }
    resolved = {**opened, "resolved_at": 150.0, "resolution": "progress resumed after 90 s"}
    report = score([], [opened, resolved])
    assert report["false_alarms_resolved"] == 1 and report["anomalies"] == 1


def test_archives_written_before_the_lifecycle_are_still_read(tmp_path: Path) -> None:
    old = pa.table(
        {
            "anomaly_id": ["an-old"],
            "detected_at": pa.array([1_796_205_600_000_000], pa.timestamp("us", tz="UTC")),
            "kind": ["crash"],
            "category": ["xid_79"],
            "layer": ["hardware"],
        }
    )
    (tmp_path / "anomalies" / "date=2026-12-02").mkdir(parents=True)
    pq.write_table(old, tmp_path / "anomalies" / "date=2026-12-02" / "part-old.parquet")
    frame = read_dataset(tmp_path, "anomalies")
    assert frame.height == 1 and frame["resolved_at"].to_list() == [None] and "severity" in frame.columns


def test_monitor_records_round_trip_through_the_wire_contract() -> None:
    anomaly = Anomaly(
        anomaly_id="a",
        detected_at=1.0,
        kind="hang",
        category="no_progress",
        resolved_at=2.0,
        resolution="progress resumed after 1 s",
        severity="critical",
    )
    assert msgspec.json.decode(msgspec.json.encode(anomaly), type=Anomaly) == anomaly


def test_gpu_samples_keep_flowing_into_a_resolved_job() -> None:
    mon = JobMonitor("7")
    mon.observe(JobEvent(ts=0.0, job_id="7", state="RUNNING", nodes=["n1"]))
    for t in range(0, 100, 10):
        assert mon.observe(GpuSample(ts=float(t), node="n1", gpu=0, util_pct=99.0, power_w=500.0)) == []


def test_state_snapshotted_before_the_lifecycle_still_resumes() -> None:
    """Monitors, history and policy pickled by the previous release (a --recovery directory),
    whose modules were ``detectors.*`` and ``actions.*`` before the one import root."""
    from trainguard.dataflows.snapshots import restore

    state = restore((FIXTURES / "state-before-lifecycle.pkl").read_bytes())
    job = state["job"]
    found = [a for t in range(60, 200, 5) for a in job.advance(float(t))]
    assert [(a.kind, a.category) for a in found] == [("crash", "nccl_timeout")]  # the cascade it held
    crash = job.observe(LogRecord(ts=300.0, job_id="7", node="n1", source="kernel", line=XID79))
    assert [a.category for a in crash if not a.resolved] == ["xid_79"]
    assert state["node"].observe(GpuSample(ts=40.0, node="n9", gpu=0, util_pct=0.0, temp_c=31.0)) == []
    assert [x.action for x in state["policy"].decide(state["history"].revise(found[0]))] == ["requeue_job"]
