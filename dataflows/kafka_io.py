"""Kafka input and output through Bytewax's connector (confluent-kafka underneath)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from datetime import datetime
from pathlib import Path
from typing import Any, NamedTuple

import msgspec
from bytewax.connectors.kafka import (
    KafkaError,
    KafkaSink,
    KafkaSinkMessage,
    KafkaSource,
    KafkaSourceMessage,
)
from bytewax.inputs import FixedPartitionedSource, StatefulSourcePartition
from confluent_kafka import OFFSET_BEGINNING, OFFSET_END, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from trainguard.actions.records import Action
from trainguard.dataflows.config import ConfigError, KafkaSettings
from trainguard.dataflows.records import RawRecord, Routed
from trainguard.dataflows.replay import merged_records
from trainguard.detectors.events import TOPICS, Anomaly, DeadLetter
from trainguard.detectors.shards import Drained

# Streams whose records come only when asked for (stack dumps answer a diagnose): empty most of the
# time, so the clock does not wait for them at the start; a partition joins the clock when it delivers.
ON_REQUEST = frozenset({"stacks"})


class InputTopics(NamedTuple):
    topics: list[str]  # Kafka topic names to consume
    clock_partitions: list[str]  # "<stream>/<partition>" for every partition, for the watermark


def broker_topics(settings: KafkaSettings, timeout_s: float = 10.0) -> dict[str, Any]:
    """The brokers' topic metadata; one sentence (not librdkafka's retry log) when they cannot be reached."""
    if not settings.brokers:
        raise ConfigError("no Kafka brokers given; pass --brokers HOST:PORT or set TRAINGUARD_BROKERS.")
    # log_level 0: this probe stays quiet; the clients created afterwards log as configured.
    admin = AdminClient({"bootstrap.servers": ",".join(settings.brokers), **settings.extra, "log_level": 0})
    try:
        return admin.list_topics(timeout=timeout_s).topics
    except Exception as exc:  # confluent-kafka raises KafkaException with a nested error
        raise ConfigError(
            f"cannot reach the Kafka brokers at {','.join(settings.brokers)} within {timeout_s:g} s ({exc}); "
            "check --brokers / TRAINGUARD_BROKERS."
        ) from None


def check_topics(settings: KafkaSettings, timeout_s: float = 10.0) -> InputTopics:
    """The input topics that exist on the brokers; one-sentence error when none do."""
    metadata = broker_topics(settings, timeout_s)
    topics: list[str] = []
    partitions: list[str] = []
    for stream in TOPICS:
        name = settings.topic_for(stream)
        if name in metadata:
            topics.append(name)
            if stream not in ON_REQUEST:
                partitions += [f"{stream}/{p}" for p in sorted(metadata[name].partitions)]
    if not topics:
        wanted = ", ".join(settings.topic_for(t) for t in TOPICS)
        raise ConfigError(
            f"none of the input topics {wanted} exist on {','.join(settings.brokers)}; "
            "create them or map streams to existing topics with kafka.topics in the config."
        )
    return InputTopics(topics, partitions)


def kafka_source(settings: KafkaSettings, topics: list[str]) -> KafkaSource:
    return KafkaSource(
        brokers=settings.brokers,
        topics=topics,
        tail=True,
        starting_offset=OFFSET_BEGINNING if settings.starting_offset == "beginning" else OFFSET_END,
        add_config=dict(settings.extra),
        batch_size=settings.batch_size,
        raise_on_errors=False,
    )


class KafkaRecordMapper:
    """Kafka messages (and consumer errors) → :class:`RawRecord` or :class:`DeadLetter`.

    It also remembers the last offset read per topic-partition, for the lag monitor.
    """

    def __init__(self, settings: KafkaSettings) -> None:
        self._stream = {settings.topic_for(t): t for t in TOPICS}
        self.positions: dict[tuple[str, int], int] = {}

    def __call__(
        self, msg: KafkaSourceMessage[Any, Any] | KafkaError[Any, Any] | _Drained
    ) -> RawRecord | DeadLetter | Routed:
        if type(msg) is _Drained:
            clock = f"{self._stream.get(msg.topic, msg.topic)}/{msg.partition}"
            return Routed(clock, (len(TOPICS), 0, 0), Drained(), None)
        if isinstance(msg, KafkaError):
            inner = msg.msg
            return DeadLetter(
                topic=str(inner.topic),
                partition=inner.partition or 0,
                offset=inner.offset or -1,
                reason=f"Kafka consumer error: {msg.err}",
                payload=inner.value or b"",
            )
        stream = self._stream.get(msg.topic or "", msg.topic or "?")
        partition = msg.partition or 0
        self.positions[(msg.topic or "?", partition)] = msg.offset or 0
        return RawRecord(stream, partition, msg.offset or 0, msg.value or b"", f"{stream}/{partition}")


class LagMonitor:
    """Every ``interval_s``, sets ``trainguard_consumer_lag_messages`` = high watermark − next offset to read."""

    def __init__(self, settings: KafkaSettings, mapper: KafkaRecordMapper, topics: list[str], interval_s: float = 5.0):
        import threading

        from confluent_kafka import Consumer

        self._consumer = Consumer(
            {"bootstrap.servers": ",".join(settings.brokers), "group.id": "trainguard-lag", **settings.extra}
        )
        self._mapper = mapper
        self._topics = topics
        self._interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="consumer-lag", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        from confluent_kafka import TopicPartition

        from trainguard.dataflows import metrics

        while not self._stop.wait(self._interval_s):
            try:
                meta = self._consumer.list_topics(timeout=5).topics
                for topic in self._topics:
                    for partition in meta[topic].partitions if topic in meta else ():
                        _, high = self._consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=5)
                        read = self._mapper.positions.get((topic, partition), -1) + 1
                        metrics.CONSUMER_LAG.labels(topic, str(partition)).set(max(0, high - read))
            except Exception:
                continue

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self._consumer.close()


def kafka_sink(settings: KafkaSettings) -> KafkaSink:
    return KafkaSink(brokers=settings.brokers, topic=None, add_config=dict(settings.extra))


def to_kafka_message(settings: KafkaSettings, item: Anomaly | Action | DeadLetter) -> KafkaSinkMessage[bytes, bytes]:
    """Output records as JSON, keyed by job (or target) so one job's records stay in order."""
    if isinstance(item, Anomaly):
        key = item.job_id or ",".join(item.nodes)
        return KafkaSinkMessage(key.encode(), msgspec.json.encode(item), topic=settings.anomalies_topic)
    if isinstance(item, Action):
        return KafkaSinkMessage(item.target.encode(), msgspec.json.encode(item), topic=settings.actions_topic)
    headers = [("reason", item.reason.encode()[:1000]), ("source_topic", item.topic.encode())]
    return KafkaSinkMessage(item.topic.encode(), item.payload, topic=settings.dead_letter_topic, headers=headers)


def produce_replay(directory: Path, settings: KafkaSettings, speed: float | None = None) -> dict[str, int]:
    """Publish a replay directory's records to the input topics in event-time order.

    ``speed`` paces publication (60 = one hour of event time per minute); ``None``
    publishes as fast as the broker takes it. Returns records published per topic.
    """
    return produce_records(((key, rec.topic, rec.payload) for key, rec in merged_records(directory)), settings, speed)


def produce_records(
    records: Iterable[tuple[float, str, bytes]], settings: KafkaSettings, speed: float | None = None
) -> dict[str, int]:
    """Publish ``(event time, stream, JSON bytes)`` records, in the order given, to the input topics."""
    producer = Producer({"bootstrap.servers": ",".join(settings.brokers), "linger.ms": 5, **settings.extra})
    counts: dict[str, int] = {}
    origin: tuple[float, float] | None = None
    for key, stream, payload in records:
        if speed is not None:
            if origin is None:
                origin = (key, time.time())
            delay = origin[1] + (key - origin[0]) / speed - time.time()
            if delay > 0:
                producer.flush()
                time.sleep(delay)
        while True:
            try:
                producer.produce(settings.topic_for(stream), payload)
                break
            except BufferError:  # local queue full: let it drain
                producer.poll(0.1)
        producer.poll(0)
        counts[stream] = counts.get(stream, 0) + 1
    remaining = producer.flush(30)
    if remaining:
        raise RuntimeError(f"{remaining} records were not delivered to {','.join(settings.brokers)} within 30s")
    return counts


def create_topics(settings: KafkaSettings, partitions: int = 1, timeout_s: float = 10.0) -> list[str]:
    """Create the input and output topics that do not exist yet; returns those created."""
    admin = AdminClient({"bootstrap.servers": ",".join(settings.brokers), **settings.extra})
    existing = set(admin.list_topics(timeout=timeout_s).topics)
    names = [settings.topic_for(t) for t in TOPICS]
    names += [settings.anomalies_topic, settings.actions_topic, settings.dead_letter_topic]
    new = [NewTopic(n, num_partitions=partitions, replication_factor=1) for n in names if n not in existing]
    if new:
        for future in admin.create_topics(new, operation_timeout=timeout_s).values():
            future.result(timeout_s)
    return [t.topic for t in new]


class _Drained(NamedTuple):
    """What a live partition yields when its consumer has read all the broker holds."""

    topic: str
    partition: int


# How often (wall seconds) an idle partition asks its broker whether it has drained; the clock
# believes an answer for ``clock.DRAIN_REPORT_TTL_S``.
DRAIN_PROBE_S = 1.0


class _LivePartition(StatefulSourcePartition[Any, Any]):
    """One Kafka partition of the live source: ends when ``stop`` is set; says when it has drained."""

    def __init__(
        self, inner: StatefulSourcePartition[Any, Any], stop: threading.Event | None, probe: _EndProbe, part: str
    ) -> None:
        self._inner = inner
        self._stop = stop
        self._probe = probe
        index, self._topic = part.split("-", 1)  # Bytewax names Kafka partitions "<index>-<topic>"
        self._index = int(index)
        self._next_probe = 0.0

    def next_batch(self) -> list[Any]:
        if self._stop is not None and self._stop.is_set():
            raise StopIteration  # end of input: the flow drains, releases its holds, and closes its sinks
        batch = self._inner.next_batch()
        if batch:
            return batch
        now = time.monotonic()
        if now < self._next_probe:
            return batch
        self._next_probe = now + DRAIN_PROBE_S
        if self._probe.drained(self._topic, self._index, self._inner.snapshot()):
            return [_Drained(self._topic, self._index)]
        return batch

    def next_awake(self) -> datetime | None:
        return None if self._stop is not None and self._stop.is_set() else self._inner.next_awake()

    def snapshot(self) -> Any:
        return self._inner.snapshot()

    def close(self) -> None:
        self._inner.close()
        self._probe.close()


class _EndProbe:
    """Asks the broker where a partition ends (one client per process, made on first use)."""

    def __init__(self, settings: KafkaSettings) -> None:
        self._config = {"bootstrap.servers": ",".join(settings.brokers), "group.id": "trainguard-end", **settings.extra}
        self._consumer: Any = None
        self._users = 0
        self._lock = threading.Lock()

    def open(self) -> _EndProbe:
        with self._lock:
            self._users += 1
        return self

    def drained(self, topic: str, partition: int, next_offset: int | None) -> bool:
        """Whether a consumer that reads ``next_offset`` next has everything the broker holds."""
        from confluent_kafka import Consumer, KafkaException, TopicPartition

        with self._lock:
            if self._consumer is None:
                self._consumer = Consumer({**self._config, "log_level": 0})
        try:
            low, high = self._consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=0.5)
        except KafkaException:
            return False  # no answer: the partition keeps holding the clock, as if it had more
        if next_offset is None or next_offset == OFFSET_BEGINNING:
            return high <= low  # nothing read yet: drained only when the partition is empty
        if next_offset < 0:
            return True  # OFFSET_END: only what is produced from now on is ours
        return next_offset >= high

    def close(self) -> None:
        with self._lock:
            self._users -= 1
            if self._users == 0 and self._consumer is not None:
                self._consumer.close()
                self._consumer = None


class LiveKafkaSource(FixedPartitionedSource[Any, Any]):
    """The Kafka input of a live run: reports drained partitions, and ends cleanly when ``stop`` is set.

    A partition that has read all its broker holds says so (a ``_Drained`` item, about once
    a second while it stays so): the clock lets only such a partition stop holding it back
    when it falls silent, so a slow consumer's records are never overtaken by the watermark.
    Ending the input (``stop``, a service manager's SIGTERM) is how Bytewax shuts a flow
    down in order: the router releases what it buffered and tells every job the input
    ended, held lines are reported, sinks flush.
    """

    def __init__(self, settings: KafkaSettings, topics: list[str], stop: threading.Event | None = None) -> None:
        self.inner = kafka_source(settings, topics)
        self.stop = stop
        self.probe = _EndProbe(settings)

    def list_parts(self) -> list[str]:
        return self.inner.list_parts()

    def build_part(self, step_id: str, for_part: str, resume_state: Any) -> _LivePartition:
        inner = self.inner.build_part(step_id, for_part, resume_state)
        return _LivePartition(inner, self.stop, self.probe.open(), for_part)
