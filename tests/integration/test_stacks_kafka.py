"""``collect-stacks`` waiting for requests: a diagnose action on a real Kafka-protocol broker (Tansu) is
answered with the real py-spy stacks of real rank processes, published to the stacks topic."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import msgspec
import pytest
from confluent_kafka import Producer

from tests.conftest import Broker
from tests.support.kafka import consume_all
from tests.support.stack_procs import job_env, rank_processes
from trainguard.agents.publisher import RecordPublisher
from trainguard.agents.stacks import StackAgent, serve
from trainguard.dataflows.config import KafkaSettings, Settings
from trainguard.dataflows.kafka_io import create_topics
from trainguard.detectors.events import StacksRecord, decode

pytestmark = pytest.mark.kafka


def test_a_diagnose_action_is_answered_once_on_the_stacks_topic(tansu: Broker, tmp_path: Path) -> None:
    settings = Settings(kafka=KafkaSettings(brokers=[tansu.address]))
    create_topics(settings.kafka)
    job = f"tg-kafka-{os.getpid()}"
    publisher = RecordPublisher(settings, None)
    stop = threading.Event()

    def publish(record: dict) -> None:
        publisher.publish("stacks", record, key=job)
        publisher.flush()

    with rank_processes(tmp_path) as ranks:
        for rank in range(3):
            ranks.start(job_env(job, rank, 3, "loader" if rank == 1 else "collective"))
        ranks.settle()
        agent = StackAgent("n1", min_interval_s=0.0)
        loop = threading.Thread(target=serve, args=(agent, [tansu.address], "actions", publish, stop), daemon=True)
        loop.start()
        producer = Producer({"bootstrap.servers": tansu.address})
        try:
            answered: list[bytes] = []
            deadline = time.monotonic() + 60
            attempt = 0
            while not answered and time.monotonic() < deadline:
                # The agent reads from the newest offset: ask until its consumer has joined and answers.
                attempt += 1
                action = {"action_id": f"ac-{attempt}", "action": "diagnose", "target": job, "status": "applied",
                          "params": {"nodes": ""}, "decided_at": time.time()}  # fmt: skip
                producer.produce("actions", json.dumps(action).encode(), key=job.encode())
                producer.produce("actions", json.dumps(action).encode(), key=job.encode())  # delivered twice
                producer.flush(10)
                answered = consume_all(tansu.address, "stacks", 3, timeout_s=3)
        finally:
            stop.set()
            loop.join(timeout=10)
            publisher.close()
    records = [decode("stacks", value) for value in answered]
    assert all(isinstance(r, StacksRecord) for r in records), records
    assert sorted(r.rank for r in records) == [0, 1, 2]  # type: ignore[union-attr]
    assert len({r.request for r in records}) == 1  # type: ignore[union-attr]  # one request, answered once
    later = consume_all(tansu.address, "stacks", 10, timeout_s=2)
    assert len(later) == 3  # the duplicate delivery was not answered again
    by_rank = {r.rank: msgspec.to_builtins(r) for r in records}  # type: ignore[union-attr]
    assert "load_batch" in json.dumps(by_rank[1]) and "all_reduce" in json.dumps(by_rank[0])
