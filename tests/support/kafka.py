"""Kafka helpers the broker tests share."""

from __future__ import annotations

import time

from confluent_kafka import Consumer, Producer, TopicPartition


def consume_all(address: str, topic: str, expect: int, timeout_s: float, partitions: int = 1) -> list[bytes]:
    consumer = Consumer({"bootstrap.servers": address, "group.id": "t", "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    values: list[bytes] = []
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline and len(values) < expect:
            for msg in consumer.consume(500, 0.5):
                if msg.error() is None:
                    values.append(msg.value())
    finally:
        consumer.close()
    return values


def produce_garbage(address: str) -> list[bytes]:
    """Publish three records no decoder accepts to the logs topic; return them."""
    garbage = [b"{not json", b'{"ts": 1796205600, "node": 3, "line": "x"}', b"\x00\xffjunk"]
    producer = Producer({"bootstrap.servers": address})
    for value in garbage:
        producer.produce("logs", value)
    producer.flush(10)
    return garbage
