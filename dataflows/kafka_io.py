"""Kafka input and output through Bytewax's connector (confluent-kafka underneath)."""

from __future__ import annotations

from typing import Any

import msgspec
from bytewax.connectors.kafka import (
    KafkaError,
    KafkaSink,
    KafkaSinkMessage,
    KafkaSource,
    KafkaSourceMessage,
)
from confluent_kafka import OFFSET_BEGINNING, OFFSET_END
from confluent_kafka.admin import AdminClient

from dataflows.config import ConfigError, KafkaSettings
from dataflows.records import RawRecord
from detectors.events import TOPICS, Action, Anomaly, DeadLetter


def check_topics(settings: KafkaSettings, timeout_s: float = 10.0) -> list[str]:
    """The input topics that exist on the brokers; one-sentence error when none do."""
    if not settings.brokers:
        raise ConfigError("no Kafka brokers given; pass --brokers HOST:PORT or set TRAINGUARD_BROKERS.")
    admin = AdminClient({"bootstrap.servers": ",".join(settings.brokers), **settings.extra})
    try:
        existing = set(admin.list_topics(timeout=timeout_s).topics)
    except Exception as exc:  # confluent-kafka raises KafkaException with a nested error
        raise ConfigError(f"cannot reach Kafka brokers {','.join(settings.brokers)} ({exc}).") from None
    wanted = [settings.topic_for(t) for t in TOPICS]
    present = [t for t in wanted if t in existing]
    if not present:
        raise ConfigError(
            f"none of the input topics {', '.join(wanted)} exist on {','.join(settings.brokers)}; "
            "create them or map streams to existing topics with kafka.topics in the config."
        )
    return present


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
    """Kafka messages (and consumer errors) → :class:`RawRecord` or :class:`DeadLetter`."""

    def __init__(self, settings: KafkaSettings) -> None:
        self._stream = {settings.topic_for(t): t for t in TOPICS}

    def __call__(self, msg: KafkaSourceMessage[Any, Any] | KafkaError[Any, Any]) -> RawRecord | DeadLetter:
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
        return RawRecord(stream, partition, msg.offset or 0, msg.value or b"", f"{stream}/{partition}")


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
