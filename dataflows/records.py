"""The raw record every source produces before decoding."""

from __future__ import annotations

from typing import NamedTuple

from trainguard.detectors.events import Event


class RawRecord(NamedTuple):
    """Undecoded bytes of one record and where they came from."""

    topic: str  # logical stream: logs | progress | gpu | scheduler
    partition: int
    offset: int  # Kafka offset, or line/row number in a replay file
    payload: bytes
    # Which ordered stream this record belongs to, for the watermark: a Kafka
    # topic-partition, or the single time-merged stream of a replay.
    clock: str


# What the router takes: (clock partition, tie-break order, event, original bytes).
Routed = tuple[str, tuple[int, int, int], Event, bytes]
