"""The event-time clock shared by live and replay runs.

Hangs are the *absence* of events, so detectors need to know how far time has
moved. They never read the wall clock: they are driven by :class:`Tick` values
from this clock, so a replay of yesterday's records fires the same deadlines at
the same event times as the live run did.

The watermark is the minimum over source partitions of the newest timestamp each
has delivered, minus an allowed lateness (a partition that lags holds the clock
back, as in Flink). In live mode a partition that has been silent for
``idle_after_s`` of wall time stops holding the clock back, and when *every*
partition is silent the watermark keeps moving with the wall clock — otherwise a
cluster-wide hang would stop the very clock that is meant to detect it.

Silence alone cannot tell an empty partition from one whose consumer is slow (a busy
worker, a slow first fetch): with ``drain_reports`` (live Kafka) a partition counts as
silent only while its source keeps saying it has *drained* — read all the broker holds
(:meth:`EventClock.drained`, refreshed about every second) — so records a slow
consumer has yet to read are never overtaken by the watermark.

Ticks are emitted on a fixed grid (``tick_s``), every grid point once, so the
first tick at or past a deadline is the same value whatever the batching.

>>> clock = EventClock(lateness_s=2.0, tick_s=5.0)
>>> clock.observe("logs/0", 1000.0)
>>> clock.ticks()
[995.0]
>>> clock.observe("logs/0", 1013.0)
>>> clock.ticks()
[1000.0, 1005.0, 1010.0]
"""

from __future__ import annotations

import math

# A drain report is believed this long (wall seconds): sources refresh it about every second
# while they stay drained, so a partition whose records start to back up holds the clock again.
DRAIN_REPORT_TTL_S = 3.0


class EventClock:
    """Watermark over source partitions, with grid ticks and optional idle extrapolation."""

    def __init__(
        self,
        lateness_s: float = 2.0,
        tick_s: float = 5.0,
        idle_after_s: float | None = None,
        max_catchup_ticks: int = 720,
        drain_reports: bool = False,
    ) -> None:
        self.lateness_s = lateness_s
        self.tick_s = tick_s
        self.idle_after_s = idle_after_s
        self.max_catchup_ticks = max_catchup_ticks
        self.drain_reports = drain_reports
        self._drained: dict[str, float] = {}  # partition -> wall time its source last said it had drained
        self._newest: dict[str, float] = {}
        self._last_wall: dict[str, float] = {}
        self._watermark = -math.inf
        self._last_tick: float | None = None
        self.max_ts = -math.inf

    def expect(self, partition: str, wall: float | None = None) -> None:
        """Declare a partition before it delivers: the watermark waits for it (or, live, for it to go idle)."""
        self._newest.setdefault(partition, -math.inf)
        if wall is not None:
            self._last_wall.setdefault(partition, wall)

    def __setstate__(self, state: dict[str, object]) -> None:
        # A snapshot from before drain reports resumes with silence alone deciding idleness.
        state.setdefault("drain_reports", False)
        state.setdefault("_drained", {})
        self.__dict__.update(state)

    @property
    def live(self) -> bool:
        return self.idle_after_s is not None

    def observe(self, partition: str, ts: float, wall: float | None = None) -> None:
        """Record that ``partition`` delivered an event stamped ``ts`` (at wall time ``wall``)."""
        if ts > self._newest.get(partition, -math.inf):
            self._newest[partition] = ts
        if ts > self.max_ts:
            self.max_ts = ts
        if wall is not None:
            self._last_wall[partition] = wall

    def drained(self, partition: str, wall: float) -> None:
        """``partition``'s source has delivered everything its broker holds (as of ``wall``)."""
        self._drained[partition] = wall

    def _silent(self, partition: str, wall: float) -> bool:
        last = self._last_wall.get(partition, wall)
        if wall - last < self.idle_after_s:  # type: ignore[operator]
            return False
        if not self.drain_reports:
            return True
        said = self._drained.get(partition, -math.inf)
        return said >= last and wall - said < DRAIN_REPORT_TTL_S

    @property
    def current(self) -> float:
        """The watermark as last computed (no recomputation)."""
        return self._watermark

    def watermark(self, wall: float | None = None) -> float:
        """Current watermark; never moves backwards."""
        if not self._newest:
            return self._watermark
        if self.live and wall is not None:
            assert self.idle_after_s is not None
            busy = [newest for part, newest in self._newest.items() if not self._silent(part, wall)]
            if busy:
                candidate = min(busy) - self.lateness_s
            else:
                # Every source is silent: let event time flow with the wall clock.
                silent_for = wall - max(self._last_wall.values(), default=wall)
                candidate = self.max_ts - self.lateness_s + silent_for
        else:
            candidate = min(self._newest.values()) - self.lateness_s
        if candidate > self._watermark:
            self._watermark = candidate
        return self._watermark

    def finish(self) -> float:
        """End of a finite input: everything has arrived, so lateness no longer applies."""
        if self.max_ts > self._watermark:
            self._watermark = self.max_ts
        return self._watermark

    def ticks(self, wall: float | None = None) -> list[float]:
        """Grid points the watermark has crossed since the last call, oldest first."""
        return self.grid_points(self.watermark(wall))

    def grid_points(self, watermark: float, since: float | None = None) -> list[float]:
        """Grid points up to ``watermark`` not handed out before.

        ``since``: the earliest event about to be released. The first call then hands out every
        grid point from the one at or before it, not only the last: how far the watermark had got
        when it was first known (a live source's sparse partition that delivers last, a replay's
        first batch) must not decide which deadlines get a tick of their own.

        >>> EventClock(tick_s=5.0).grid_points(1013.0, since=1001.0)
        [1000.0, 1005.0, 1010.0]
        """
        if watermark == -math.inf:
            return []
        top = float(math.floor(watermark / self.tick_s)) * self.tick_s
        if self._last_tick is None:
            first = top if since is None else min(top, float(math.floor(since / self.tick_s)) * self.tick_s)
            self._last_tick = first - self.tick_s
        if top <= self._last_tick:
            return []
        count = round((top - self._last_tick) / self.tick_s)
        if count > self.max_catchup_ticks:
            # A long silence: jump instead of flooding every key with ticks.
            start = top - (self.max_catchup_ticks - 1) * self.tick_s
            points = [start + i * self.tick_s for i in range(self.max_catchup_ticks)]
        else:
            points = [self._last_tick + (i + 1) * self.tick_s for i in range(count)]
        self._last_tick = top
        return points
