"""Feed the console from Kafka: the anomalies topic (from the beginning) and the progress topic (live).

One consumer with explicit partition assignment (no consumer group, nothing committed):
the console only reads.
"""

from __future__ import annotations

import threading
from typing import Any

import msgspec
from confluent_kafka import OFFSET_BEGINNING, OFFSET_END, Consumer, TopicPartition

from trainguard.console.data import ConsoleData
from trainguard.dataflows.config import KafkaSettings
from trainguard.detectors.events import Anomaly, ProgressRecord, decode


class KafkaTail:
    """Reads anomalies and progress into a :class:`ConsoleData` on a daemon thread."""

    def __init__(self, settings: KafkaSettings, data: ConsoleData) -> None:
        self.data = data
        self.anomalies_topic = settings.anomalies_topic
        self.progress_topic = settings.topic_for("progress")
        self._consumer = Consumer(
            {
                "bootstrap.servers": ",".join(settings.brokers),
                "group.id": "trainguard-console",
                "enable.auto.commit": False,
                **settings.extra,
            }
        )
        meta = self._consumer.list_topics(timeout=10).topics
        assignment = []
        for topic, start in ((self.anomalies_topic, OFFSET_BEGINNING), (self.progress_topic, OFFSET_END)):
            for partition in meta[topic].partitions if topic in meta else ():
                assignment.append(TopicPartition(topic, partition, start))
        self._consumer.assign(assignment)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="console-kafka", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            anomalies: list[dict[str, Any]] = []
            progress: list[tuple[str, float, int]] = []
            for msg in self._consumer.consume(1000, 0.5):
                if msg.error() is not None or msg.value() is None:
                    continue
                if msg.topic() == self.anomalies_topic:
                    try:
                        anomalies.append(msgspec.to_builtins(msgspec.json.decode(msg.value(), type=Anomaly)))
                    except msgspec.DecodeError:
                        continue  # not ours to judge: the console shows what decodes
                else:
                    event = decode("progress", msg.value())
                    if isinstance(event, ProgressRecord) and event.job_id is not None:
                        progress.append((str(event.job_id), float(event.ts), int(event.step)))  # type: ignore[arg-type]
            if anomalies or progress:
                self.data.add(anomalies, progress)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._consumer.close()
