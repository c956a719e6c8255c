"""The raw record every source produces before decoding."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
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


class Routed(NamedTuple):
    """A decoded record on its way to the router (a tuple: cheap to build, and what older snapshots hold)."""

    clock: str  # the ordered stream it belongs to, for the watermark
    order: tuple[int, int, int]  # tie-break among equal timestamps: (topic index, partition, offset)
    event: Event
    payload: bytes | None  # the original bytes, for a dead letter if the router refuses it (None: a heartbeat)


# A Routed from its fields as one tuple, built in C without the named tuple's Python ``__new__`` (the
# replay reader makes one per record).
routed: Callable[[tuple[str, tuple[int, int, int], Event, bytes | None]], Routed] = partial(tuple.__new__, Routed)
