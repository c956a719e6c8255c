"""Live run against a real Kafka-protocol broker (Tansu) finds what the replay finds."""

from __future__ import annotations

import os
import subprocess
import time
import urllib.request

import msgspec
import pytest

from tests.conftest import DEMO_DIR, Broker, replay, stop_process, summary
from tests.support.kafka import consume_all, produce_garbage
from tests.support.tansu import free_port, start_trainguard
from trainguard.dataflows.archive import read_dataset
from trainguard.dataflows.config import KafkaSettings
from trainguard.dataflows.kafka_io import KafkaRecordMapper, create_topics, produce_replay
from trainguard.dataflows.ports import free_ports
from trainguard.detectors.events import Anomaly

pytestmark = pytest.mark.kafka


def test_live_kafka_run_matches_replay(tansu: Broker, tmp_path):
    settings = KafkaSettings(brokers=[tansu.address])
    create_topics(settings)
    counts = produce_replay(DEMO_DIR, settings)
    assert sum(counts.values()) > 50_000
    garbage = produce_garbage(tansu.address)

    expected = replay(DEMO_DIR)
    metrics_port = free_port()
    run = start_trainguard(
        ["run", "--brokers", tansu.address, "--out", str(tmp_path / "out"), "--metrics-port", str(metrics_port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        raw = consume_all(tansu.address, "anomalies", len(expected.stream), timeout_s=90)
        # Wait a little longer: a duplicate or an extra anomaly would show up now.
        raw += consume_all(tansu.address, "anomalies", 10_000, timeout_s=3)[len(raw) :]
        base = f"http://127.0.0.1:{metrics_port}"
        deadline = time.monotonic() + 15
        while True:  # the lag monitor reports every 5 s
            scraped = urllib.request.urlopen(f"{base}/metrics", timeout=5).read().decode()
            if "trainguard_consumer_lag_messages{" in scraped or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        health = urllib.request.urlopen(f"{base}/healthz", timeout=5)
    finally:
        stop_process(run)
    output = run.stdout.read().decode() if run.stdout else ""
    live = [msgspec.json.decode(v, type=Anomaly) for v in raw]
    assert summary(live) == summary(expected.stream), output[-3000:]
    assert health.status == 200
    # Everything was read: no lag on any input partition.
    assert 'trainguard_consumer_lag_messages{partition="0",topic="logs"} 0.0' in scraped
    assert 'trainguard_anomalies_total{kind="crash"} 1.0' in scraped
    assert 'trainguard_dead_letters_total{topic="logs"} 3.0' in scraped
    assert 'trainguard_events_total{topic="gpu"}' in scraped and "trainguard_watermark_delay_seconds" in scraped
    assert {a.kind for a in live} == {"crash", "hang", "straggler", "node_unhealthy"}
    assert {a.resolution for a in live if a.resolved} == {a.resolution for a in expected.resolutions}
    actions = consume_all(tansu.address, "actions", len(expected.actions), timeout_s=10)
    assert sorted(msgspec.json.decode(v)["action_id"] for v in actions) == sorted(a.action_id for a in expected.actions)
    dead = consume_all(tansu.address, "dead_letter", len(garbage), timeout_s=10)
    assert sorted(dead) == sorted(garbage)  # original bytes, reason in a header
    assert "3 dead-lettered records" in output
    # Stopped by SIGTERM, the service still flushed its Parquet archive.
    archived = read_dataset(tmp_path / "out", "anomalies")
    assert sorted(archived["anomaly_id"]) == sorted(a.anomaly_id for a in expected.anomalies)


def test_generate_publishes_a_scenario_straight_to_kafka(tansu: Broker, tmp_path):
    from typer.testing import CliRunner

    from trainguard.cli.app import app

    result = CliRunner().invoke(
        app,
        [
            "generate",
            "--preset",
            "default",
            "--seed",
            "8",
            "--minutes",
            "10",
            "--brokers",
            tansu.address,
            "--out",
            str(tmp_path),
        ],
    )
    assert result.exit_code == 0, result.output
    assert (tmp_path / "labels.jsonl").is_file() and not (tmp_path / "gpu.jsonl").exists()
    published = consume_all(tansu.address, "scheduler", 10_000, timeout_s=5)
    states = [msgspec.json.decode(v)["state"] for v in published]
    assert states.count("RUNNING") >= 20 and "FAILED" in states


def test_ship_logs_delivers_each_line_once_across_restarts(tansu: Broker, tmp_path):
    from typer.testing import CliRunner

    from trainguard.cli.app import app

    create_topics(KafkaSettings(brokers=[tansu.address]))
    log = tmp_path / "slurm-77.out"
    log.write_text("0: step 1\n0: step 2\n")
    args = [
        "ship-logs",
        str(log),
        "--brokers",
        tansu.address,
        "--state",
        str(tmp_path / "state.json"),
        "--once",
        "--node",
        "gpu-node-03",
    ]
    runner = CliRunner()
    assert runner.invoke(app, args).exit_code == 0
    assert runner.invoke(app, args).exit_code == 0  # a restart ships nothing again
    with log.open("a") as fh:
        fh.write("0: RuntimeError: CUDA error: an illegal memory access was encountered\n")
    assert runner.invoke(app, args).exit_code == 0
    shipped = [msgspec.json.decode(v) for v in consume_all(tansu.address, "logs", 10, timeout_s=5)]
    assert [r["line"] for r in shipped] == [
        "step 1",
        "step 2",
        "RuntimeError: CUDA error: an illegal memory access was encountered",
    ]
    assert {(r["job_id"], r["node"], r["rank"]) for r in shipped} == {("77", "gpu-node-03", 0)}


def test_two_worker_processes_on_partitioned_topics_find_what_the_replay_finds(tansu: Broker, tmp_path):
    """The documented N-machine deployment, on one machine: ``trainguard run`` with the cluster's
    addresses and its place in them (as the Kubernetes StatefulSet gives them), one router shard per worker."""
    settings = KafkaSettings(brokers=[tansu.address])
    create_topics(settings, partitions=2)
    produce_replay(DEMO_DIR, settings)  # no key: records spread over both partitions of each topic
    garbage = produce_garbage(tansu.address)
    expected = replay(DEMO_DIR)
    addresses = ";".join(f"127.0.0.1:{port}" for port in free_ports(2))
    workers = [
        start_trainguard(
            ["run", "--metrics-port", "0"],
            env={**os.environ, "TRAINGUARD_BROKERS": tansu.address}
            | {"TRAINGUARD_ADDRESSES": addresses, "TRAINGUARD_PROCESS_ID": str(i)},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        for i in range(2)
    ]
    try:
        raw = consume_all(tansu.address, "anomalies", len(expected.stream), timeout_s=120, partitions=2)
        raw += consume_all(tansu.address, "anomalies", 10_000, timeout_s=3, partitions=2)[len(raw) :]
        dead = consume_all(tansu.address, "dead_letter", 10_000, timeout_s=5, partitions=2)
    finally:
        for worker in workers:
            stop_process(worker)
    output = b"".join(w.stdout.read() for w in workers if w.stdout).decode(errors="replace")
    live = [msgspec.json.decode(v, type=Anomaly) for v in raw]
    assert summary(live) == summary(expected.stream), output[-3000:]
    assert sorted(dead) == sorted(garbage)  # each refused record reported once, by one shard


def test_a_live_partition_reports_drained_only_once_it_has_read_all_its_broker_holds(tansu: Broker):
    """What lets the clock tell an empty or finished partition from a slow one (see ``EventClock``)."""
    from confluent_kafka import Producer

    from trainguard.dataflows.kafka_io import LiveKafkaSource

    settings = KafkaSettings(brokers=[tansu.address], batch_size=2)
    create_topics(settings)
    producer = Producer({"bootstrap.servers": tansu.address})
    for i in range(5):
        producer.produce("logs", f'{{"ts": {1000 + i}, "node": "n", "line": "x"}}'.encode())
    producer.flush(10)
    source = LiveKafkaSource(settings, ["logs", "gpu"])
    logs = source.build_part("input", "0-logs", None)
    gpu = source.build_part("input", "0-gpu", None)
    try:
        seen: list[object] = []
        deadline = time.monotonic() + 20
        while not any(type(item).__name__ == "_Drained" for item in seen) and time.monotonic() < deadline:
            seen += logs.next_batch()
            time.sleep(0.05)
        values = [item.value for item in seen if hasattr(item, "value")]
        assert len(values) == 5  # the report came only after the last record, never while some were unread
        assert type(seen[-1]).__name__ == "_Drained" and (seen[-1].topic, seen[-1].partition) == ("logs", 0)
        empty: list[object] = []
        deadline = time.monotonic() + 10
        while not empty and time.monotonic() < deadline:
            empty += gpu.next_batch()
            time.sleep(0.05)
        assert [type(item).__name__ for item in empty] == ["_Drained"]  # an empty partition has drained
        routed = KafkaRecordMapper(settings)(empty[0])
        assert routed.clock == "gpu/0" and type(routed.event).__name__ == "Drained"
    finally:
        logs.close()
        gpu.close()
