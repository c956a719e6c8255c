"""The raw record every source produces before decoding."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any, NamedTuple

from trainguard.detectors.events import DeadLetter, Event

REPLAY_CLOCK = "replay/0"  # a replay is one time-merged stream, one partition for the watermark


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


# A replay record as the merge orders it: (sort key, topic index, offset, event or the decoder's dead letter, bytes).
ReplayRecord = tuple[float, int, int, Any, bytes | None]


class ReplayWindow:
    """A batch of a full-speed replay's merged records handed to the router as they are — no :class:`Routed`
    made for each (``Router.route_window``); :meth:`routed` makes them for whoever wants records (the
    sharder of a flow with several router shards)."""

    __slots__ = ("records",)

    def __init__(self, records: list[ReplayRecord]) -> None:
        self.records = records

    def routed(self) -> list[Routed | DeadLetter]:
        return replay_routed(self.records)


def replay_routed(records: list[ReplayRecord]) -> list[Routed | DeadLetter]:
    """Merged replay records as :class:`Routed` (dead letters as they are)."""
    return [
        item if type(item) is DeadLetter else routed((REPLAY_CLOCK, (order, 0, offset), item, payload))
        for _, order, offset, item, payload in records
    ]
