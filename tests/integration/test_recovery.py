"""kill -9 of ``trainguard run`` at seeded random moments, then a resume: nothing lost, nothing repeated."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path

import msgspec
import polars as pl
import pytest
import yaml

from tests.conftest import Broker, replay, stop_process
from tests.support.kafka import consume_all
from tests.support.tansu import start_trainguard
from trainguard.actions.audit import read_entries
from trainguard.dataflows.config import KafkaSettings
from trainguard.dataflows.kafka_io import create_topics, produce_replay
from trainguard.datasets import generator
from trainguard.datasets.scoring import load_labels, score

pytestmark = pytest.mark.kafka


def test_kill_9_then_resume_loses_no_anomaly_and_repeats_no_action(tansu: Broker, tmp_path: Path):
    # A generated 20-minute scenario (~150k records, 20-odd faults): long enough to kill mid-stream.
    scenario = tmp_path / "scenario"
    generator.write_scenario("default", 5, scenario, minutes=20)
    kafka = KafkaSettings(brokers=[tansu.address])
    create_topics(kafka)
    produce_replay(scenario, kafka)
    expected = replay(scenario)
    config = tmp_path / "config.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "audit_log": str(tmp_path / "audit.jsonl"),
                # Enforce through the dry-run driver: every drain and requeue is "applied" once.
                "policy": {"mode": "enforce", "breaker": {"max_partition_fraction": 1.0}},
                "scheduler": {"driver": "dry-run"},
            }
        )
    )
    args = ["run", "--brokers", tansu.address, "--out", str(tmp_path / "out"), "--recovery", str(tmp_path / "rec")]
    args += ["--snapshot-s", "0.5", "--metrics-port", "0", "-c", str(config)]

    rng = random.Random(20261202)
    kills = [round(rng.uniform(2.0, 6.0), 2) for _ in range(3)]
    published_at_kill = []
    for delay in kills:
        proc = start_trainguard(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        time.sleep(delay)
        assert proc.poll() is None, proc.stderr.read().decode()[-2000:] if proc.stderr else ""
        os.killpg(proc.pid, signal.SIGKILL)  # no flush, no close: the machine died
        proc.wait()
        published_at_kill.append(len(consume_all(tansu.address, "anomalies", 10_000, timeout_s=1)))
    print("kill after s:", kills, "anomalies published by then:", published_at_kill)

    final = start_trainguard(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    want = {a.anomaly_id for a in expected.anomalies}
    seen: list[bytes] = []
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline:
            seen = consume_all(tansu.address, "anomalies", 10_000, timeout_s=2)
            if want <= {msgspec.json.decode(v)["anomaly_id"] for v in seen}:
                break
        time.sleep(2)  # let the last actions reach the audit log
    finally:
        stop_process(final)
    err = final.stderr.read().decode()[-2000:] if final.stderr else ""

    # 1. No anomaly lost: every labelled fault is still found (the topic is at-least-once;
    #    consumers deduplicate by anomaly id, which is deterministic).
    topic = [msgspec.json.decode(v) for v in consume_all(tansu.address, "anomalies", 10_000, timeout_s=3)]
    assert {a["anomaly_id"] for a in topic} == want, (kills, err)
    report = score(load_labels(scenario / "labels.jsonl"), list({a["anomaly_id"]: a for a in topic}.values()))
    assert report["missed"] == [] and report["false_positives"] == []
    # The kills did land mid-stream: at least one after some anomalies were out and before all were.
    assert any(0 < n < len(want) for n in published_at_kill), published_at_kill

    # 2. The archive is readable after the kills and, deduplicated by id, holds each anomaly once.
    archive = pl.scan_parquet(tmp_path / "out" / "anomalies" / "**" / "*.parquet", hive_partitioning=True).collect()
    assert set(archive["anomaly_id"]) == want
    assert archive.unique(subset="anomaly_id").height == len(want)

    # 3. No action repeated: one outcome per action id in the audit log, and nothing missing.
    outcomes = Counter(
        e["action_id"] for e in read_entries(tmp_path / "audit.jsonl") if e["event"] in ("applied", "suppressed")
    )
    assert outcomes and max(outcomes.values()) == 1, outcomes
    assert set(outcomes) == {a.action_id for a in expected.actions}
