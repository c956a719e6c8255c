"""The real dataflow over replay directories: faults found, garbage dead-lettered, archive readable."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest

from tests.conftest import DEMO_DIR, RunResult, replay
from trainguard.dataflows import metrics
from trainguard.dataflows.config import Settings
from trainguard.dataflows.flow import Outputs, build_flow
from trainguard.dataflows.pipeline import run
from trainguard.dataflows.replay import ReplaySource
from trainguard.datasets.generator import write_scenario
from trainguard.detectors.events import MAX_RECORD_BYTES


def test_demo_finds_the_three_faults_and_localises_them(demo_result: RunResult):
    kinds = sorted((a.kind, a.category, a.job_id or "-") for a in demo_result.anomalies)
    assert kinds == [
        ("crash", "xid_79", "1002"),
        ("hang", "no_progress", "1003"),
        # An idle node's GPU 2 starts failing (corrected ECC errors climb).
        ("node_unhealthy", "ecc_sbe_burst", "-"),
        # Once job 1002 has failed, its node sits idle with GPU 3 gone: drain it before a job lands there.
        ("node_unhealthy", "gpu_lost", "-"),
        ("straggler", "slow_rank", "1004"),
    ]
    lost, degrading = sorted(demo_result.by_kind("node_unhealthy"), key=lambda a: a.category, reverse=True)
    assert lost.nodes == ["gpu-node-04"] and lost.gpus == ["gpu-node-04/3"]
    assert degrading.nodes == ["gpu-node-10"] and degrading.gpus == ["gpu-node-10/2"]
    assert degrading.detected_at - degrading.onset_ts <= 60
    crash = demo_result.by_kind("crash")[0]
    assert crash.nodes == ["gpu-node-04"] and crash.layer == "hardware" and crash.transient is False
    assert crash.detected_at - crash.onset_ts <= 1.0
    straggler = demo_result.by_kind("straggler")[0]
    assert straggler.nodes == ["gpu-node-08"] and straggler.ranks == [11]
    assert straggler.detected_at - straggler.onset_ts <= 120
    hang = demo_result.by_kind("hang")[0]
    assert hang.nodes == ["gpu-node-06"] and hang.gpus == ["gpu-node-06/5"]  # idle while its peers spin
    # Its peers spin in NCCL kernels: two GPU samples confirm the hang, before the 55 s floor.
    assert 15 <= hang.detected_at - hang.onset_ts <= 30


def test_benign_pauses_cancel_and_counter_reset_raise_nothing(demo_result: RunResult):
    # Job 1001 pauses 150 s for a checkpoint, 1004 evaluates for 60 s, 1005 is cancelled by its user,
    # and a driver reload zeroes gpu-node-11's counters.
    assert not [a for a in demo_result.anomalies if a.job_id in ("1001", "1005")]
    assert not [a for a in demo_result.anomalies if "gpu-node-11" in a.nodes]
    assert [a.kind for a in demo_result.anomalies if a.job_id == "1004"] == ["straggler"]


def test_monitor_mode_recommends_without_acting(demo_result: RunResult):
    assert demo_result.actions and all(a.mode == "monitor" for a in demo_result.actions)
    acting = [a for a in demo_result.actions if a.action != "diagnose"]
    assert {a.status for a in acting} == {"recommended", "suppressed"}
    # Asking a hung job's nodes for stacks only reads: carried out in monitor mode, once per hang.
    diagnoses = [a for a in demo_result.actions if a.action == "diagnose"]
    assert diagnoses and {a.status for a in diagnoses} == {"applied"}
    assert len({a.anomaly_id for a in diagnoses}) == len(diagnoses) == len(demo_result.by_kind("hang"))
    # The lost GPU on gpu-node-04 150 s after its Xid 79 asks for the same drain: the cooldown folds it.
    (again,) = [a for a in demo_result.actions if a.status == "suppressed"]
    assert (again.action, again.target) == ("drain_node", "gpu-node-04") and "cooldown" in again.reason
    crash = demo_result.by_kind("crash")[0]
    assert {(a.action, a.target) for a in demo_result.actions if a.anomaly_id == crash.anomaly_id} == {
        ("drain_node", "gpu-node-04"),
        ("requeue_job", "1002"),
    }


def test_replay_is_deterministic_and_format_independent(tmp_path: Path, demo_result: RunResult):
    """The JSON Lines form of the scenario (string and float stamps) gives the same anomalies as the Parquet one."""
    write_scenario("demo", 0, tmp_path)
    again = replay(tmp_path)
    assert sorted(a.anomaly_id for a in again.anomalies) == sorted(a.anomaly_id for a in demo_result.anomalies)
    assert sorted(a.detected_at for a in again.anomalies) == sorted(a.detected_at for a in demo_result.anomalies)


def test_live_style_paced_run_matches_max_speed(demo_result: RunResult):
    """A paced replay with the live clock (wall-clock idle ticks) gives the same anomalies at the same event times."""
    live = replay(DEMO_DIR, speed=4000.0, live=True)
    key = lambda r: sorted((a.anomaly_id, a.detected_at) for a in r.anomalies)  # noqa: E731
    assert key(live) == key(demo_result)


def _inject(path: Path, at: int, lines: list[bytes]) -> None:
    rows = path.read_bytes().splitlines(keepends=True)
    rows[at:at] = [line + b"\n" for line in lines]
    path.write_bytes(b"".join(rows))


def test_garbage_is_dead_lettered_counted_and_the_flow_keeps_going(tmp_path: Path, demo_result: RunResult):
    write_scenario("demo", 0, tmp_path)
    logs = tmp_path / "logs.jsonl"
    first = json.loads(logs.read_bytes().splitlines()[1200])
    ts = first["ts"]
    good = {"ts": ts, "job_id": "1001", "node": "gpu-node-01", "line": "hello"}
    garbage = [
        b"{this is not json",
        json.dumps({**good, "node": 17}).encode(),
        b"\x00\x01\xff\xfe\x89PNG binary junk",
        json.dumps({**good, "line": "x" * (1024 * 1024)}).encode(),
        json.dumps({**good, "ts": "2090-01-01T00:00:00Z"}).encode(),  # far future, still before 2100
        json.dumps({**good, "ts": "1990-01-01T00:00:00Z"}).encode(),  # far past
        json.dumps({**good, "ts": first["ts"].replace("T10:", "T07:").replace("T11:", "T08:")}).encode(),  # 3 h late
        json.dumps({"ts": 1796205600, "kind": "job", "state": "RUNNING"}).encode(),  # wrong topic shape
    ]
    _inject(logs, 1200, garbage)
    # Out-of-order but within the allowed lateness: reordered, not refused.
    gpu = tmp_path / "gpu.jsonl"
    rows = gpu.read_bytes().splitlines(keepends=True)
    rows[500], rows[520] = rows[520], rows[500]
    gpu.write_bytes(b"".join(rows))

    refused = metrics.DEAD_LETTERS.labels(topic="logs")
    counted_before = refused._value.get()
    result = replay(tmp_path)
    reasons = sorted(d.reason for d in result.dead)
    assert len(result.dead) == len(garbage), reasons
    assert refused._value.get() - counted_before == len(garbage)  # and counted, by topic
    assert all(d.topic == "logs" for d in result.dead)
    text = "\n".join(reasons)
    for part in (
        "malformed",
        "Expected `str`, got `int` - at `$.node`",
        f"{MAX_RECORD_BYTES}-byte limit",
        "ahead of the newest event",
        "outside 2000..2100",
        "behind the watermark",
        "missing required field",
    ):
        assert part in text, part
    assert sum(len(d.payload) for d in result.dead) > 1024 * 1024  # originals kept whole
    assert sorted(a.anomaly_id for a in result.anomalies) == sorted(a.anomaly_id for a in demo_result.anomalies)


def test_with_the_detectors_off_records_are_read_and_routed_but_nothing_is_judged(tmp_path: Path):
    # (What `trainguard bench replay --run bare` measures: the flow around the detectors.)
    write_scenario("demo", 0, tmp_path)
    _inject(tmp_path / "logs.jsonl", 1200, [b"{this is not json"])
    anomalies: list = []
    dead: list = []
    outputs = Outputs(on_anomalies=anomalies.extend, on_dead_letters=dead.extend)
    run(build_flow(ReplaySource(tmp_path), Settings(), outputs, detect=False))
    assert anomalies == []
    assert [d.reason.split(":")[0] for d in dead] == ["JSON is malformed"]


def test_a_full_speed_replay_hands_the_router_its_records_as_they_are_and_counts_each_record(tmp_path: Path):
    write_scenario("demo", 0, tmp_path)
    fast = ReplaySource(tmp_path).build_part("input", "replay", None).next_batch()
    paced = ReplaySource(tmp_path, speed=1e9).build_part("input", "replay", None).next_batch()
    assert [type(item).__name__ for item in fast] == ["ReplayWindow"]  # no Routed made per record
    assert [type(item).__name__ for item in paced] == ["list"]
    lines = {t: sum(1 for _ in (tmp_path / f"{t}.jsonl").open()) for t in ("logs", "progress", "gpu", "scheduler")}
    before = {t: metrics.EVENTS.labels(t)._value.get() for t in lines}
    replay(tmp_path)
    # Every record counted once by its stream, a GPU frame by its GPUs' records.
    assert {t: metrics.EVENTS.labels(t)._value.get() - before[t] for t in lines} == lines


def test_a_bad_first_timestamp_does_not_reorder_its_whole_file(tmp_path: Path, demo_result: RunResult):
    # The file's first line says a day later: before, every line of the file was sorted by it.
    for path in DEMO_DIR.glob("*.parquet"):
        (tmp_path / path.name).write_bytes(path.read_bytes())
    (tmp_path / "logs.jsonl").write_bytes(b'{"ts": 1796205600, "node": "gpu-node-01", "line": "a day ahead"}\n')
    result = replay(tmp_path)
    assert len(result.dead) == 1 and "ahead of the newest event" in result.dead[0].reason
    assert sorted(a.anomaly_id for a in result.anomalies) == sorted(a.anomaly_id for a in demo_result.anomalies)


def test_parquet_archive_is_partitioned_and_readable_with_polars(tmp_path: Path):
    out = tmp_path / "archive"
    result = replay(DEMO_DIR, archive=out)
    # A crash mid-write leaves only a hidden temporary file, which readers never match.
    stray = out / "anomalies" / "date=2026-12-01" / ".part-w0-crashed.parquet.1234.tmp"
    stray.write_bytes(b"PAR1 half a file")
    anomalies = pl.scan_parquet(out / "anomalies" / "**" / "*.parquet").collect()
    assert sorted(anomalies["anomaly_id"].to_list()) == sorted(a.anomaly_id for a in result.stream)
    assert anomalies.schema["detected_at"] == pl.Datetime("us", "UTC")
    hive = pl.scan_parquet(out / "anomalies" / "**" / "*.parquet", hive_partitioning=True).collect()
    assert hive["date"].cast(pl.String).unique().to_list() == ["2026-12-01"]
    actions = pl.scan_parquet(out / "actions" / "**" / "*.parquet").collect()
    # Monitor mode: recommendations, and the hang's stack dump request (read-only, so applied).
    assert actions.height == len(result.actions) and set(actions["status"]) == {"recommended", "suppressed", "applied"}
    assert set(actions.filter(status="applied")["action"]) == {"diagnose"}


def test_missing_replay_directory_is_one_clear_sentence(tmp_path: Path):
    from trainguard.dataflows.replay import ReplayError, ReplaySource

    with pytest.raises(ReplayError, match=r"holds none of logs.jsonl"):
        ReplaySource(tmp_path)
    with pytest.raises(ReplayError, match="does not exist"):
        ReplaySource(tmp_path / "nope")


def test_two_workers_find_the_same_anomalies(demo_result: RunResult):
    from trainguard.dataflows import pipeline
    from trainguard.dataflows.config import Settings
    from trainguard.dataflows.flow import Outputs, build_flow
    from trainguard.dataflows.replay import ReplaySource

    found: list = []
    pipeline.run(build_flow(ReplaySource(DEMO_DIR), Settings(), Outputs(on_anomalies=found.extend)), workers=2)
    assert sorted(a.anomaly_id for a in found) == sorted(a.anomaly_id for a in demo_result.stream)


def test_topic_folders_and_mixed_formats_replay_in_time_order(tmp_path: Path, demo_result: RunResult):
    """A topic may be a folder of rolled files; JSON Lines and Parquet mix freely."""
    import shutil

    write_scenario("demo", 0, tmp_path)
    rows = (tmp_path / "gpu.jsonl").read_bytes().splitlines(keepends=True)
    folder = tmp_path / "gpu"
    folder.mkdir()
    half = len(rows) // 2
    (folder / "part-000.jsonl").write_bytes(b"".join(rows[:half]))
    (folder / "part-001.jsonl").write_bytes(b"".join(rows[half:]))
    (tmp_path / "gpu.jsonl").unlink()
    (tmp_path / "progress.jsonl").unlink()
    shutil.copy(DEMO_DIR / "progress.parquet", tmp_path / "progress.parquet")
    result = replay(tmp_path)
    assert sorted(a.anomaly_id for a in result.anomalies) == sorted(a.anomaly_id for a in demo_result.anomalies)


def test_audit_log_records_every_recommendation(tmp_path: Path):
    from trainguard.dataflows.config import Settings

    settings = Settings(audit_log=str(tmp_path / "audit.jsonl"))
    result = replay(DEMO_DIR, settings=settings)
    entries = [json.loads(line) for line in (tmp_path / "audit.jsonl").read_text().splitlines()]
    assert sorted(e["action_id"] for e in entries) == sorted(a.action_id for a in result.actions)
    assert all(e["event"] == a.status for e, a in zip(entries, result.actions, strict=True))
    assert all(e["mode"] == "monitor" and e["recorded_at"] > 0 for e in entries)
    crash = next(e for e in entries if e["action"] == "drain_node")
    # Enough to answer "why was this node drained?" without the archive.
    assert crash["category"] == "xid_79" and crash["layer"] == "hardware" and crash["job_id"] == "1002"
    assert crash["evidence"] and crash["detected_at"] > 0


def test_replaying_again_with_the_same_audit_log_repeats_nothing(tmp_path: Path):
    from trainguard.dataflows.config import Settings

    settings = Settings(audit_log=str(tmp_path / "audit.jsonl"))
    first = replay(DEMO_DIR, settings=settings)
    lines = (tmp_path / "audit.jsonl").read_text().count("\n")
    second = replay(DEMO_DIR, settings=settings)
    assert first.actions and not second.actions
    assert (tmp_path / "audit.jsonl").read_text().count("\n") == lines
