"""Where a producer command's records go: a Kafka topic, or a JSON Lines file (``--out``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec

from trainguard.dataflows.config import Settings


class RecordPublisher:
    """Publishes wire-contract records to their Kafka topics, or appends them to one file."""

    def __init__(self, settings: Settings, out: Path | None) -> None:
        self.settings = settings
        self._encode = msgspec.json.Encoder().encode
        self._file = out.open("ab") if out is not None else None
        self._producer = None
        if out is None:
            from confluent_kafka import Producer

            self._producer = Producer({"bootstrap.servers": ",".join(settings.kafka.brokers), **settings.kafka.extra})

    def publish(self, topic: str, record: dict[str, Any], key: str | None = None) -> None:
        payload = self._encode(record)
        if self._file is not None:
            self._file.write(payload + b"\n")
        else:
            assert self._producer is not None
            self._producer.produce(
                self.settings.kafka.topic_for(topic), payload, key=key.encode() if key is not None else None
            )

    def flush(self, timeout_s: float = 10.0) -> int:
        """Write out what was published; the number of records the brokers have not confirmed yet."""
        if self._file is not None:
            self._file.flush()
        return self._producer.flush(timeout_s) if self._producer is not None else 0

    def close(self) -> None:
        self.flush()
        if self._file is not None:
            self._file.close()
