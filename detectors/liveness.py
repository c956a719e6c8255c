"""Which ranks of a job are alive: the probe's steps and beats, per rank.

The progress probe sends a *beat* from its own thread whenever it has sent nothing for a few
seconds (:mod:`trainguard.probe`). A rank blocked in a collective keeps beating — the
collective releases the GIL — while a rank whose process was stopped, frozen or killed falls
silent. So when a job stops stepping, the ranks that also stopped *beating* while their peers
go on are the ones to blame: no GPU telemetry and no stack dump needed.

It also remembers which process is which rank (every probe record carries its ``pid``), so a
launcher's "failed (exitcode: -9) local_rank: 2 (pid: 5109)" names the job's rank, not just a
local index.

>>> live = Liveness()
>>> for t in range(0, 60, 5):  # ranks 0, 1 and 3 beat every 5 s; rank 2 went quiet at t=12
...     for rank in (0, 1, 3):
...         live.observe(1000.0 + t, rank, "n1", pid=100 + rank, beat=True)
>>> live.observe(1012.0, 2, "n1", pid=102, beat=False)
>>> live.silent(1055.0)
[(2, 'n1', 1012.0)]
>>> live.rank_of("n1", 102)
2
"""

from __future__ import annotations

BEAT_S = 5.0  # the probe's default beat interval, until a job's own is seen
MAX_RANKS = 65_536  # ranks remembered per job (a bound, not a limit any job reaches)


class Liveness:
    """Last sign of life per rank, and each rank's process."""

    def __init__(self, silent_beats: float = 3.0, min_silent_s: float = 10.0) -> None:
        self.silent_beats = silent_beats
        self.min_silent_s = min_silent_s
        self._seen: dict[int, tuple[float, str]] = {}  # rank -> (last record, node)
        self._pids: dict[tuple[str, int], int] = {}  # (node, pid) -> rank
        self._beat_s: float | None = None  # the shortest gap seen between two beats of a rank
        self._last_beat: dict[int, float] = {}
        self.beats = False  # whether this job's probe beats at all (an older probe does not)

    def observe(self, ts: float, rank: int, node: str, pid: int | None = None, beat: bool = False) -> None:
        """A probe record of ``rank`` (a step or a beat)."""
        seen = self._seen.get(rank)
        if seen is None and len(self._seen) >= MAX_RANKS:
            return
        if seen is None or ts >= seen[0]:
            self._seen[rank] = (ts, node)
        if pid is not None:
            self._pids[(node, pid)] = rank
        if beat:
            self.beats = True
            last = self._last_beat.get(rank)
            if last is not None and ts > last:
                gap = ts - last
                self._beat_s = gap if self._beat_s is None else min(self._beat_s, max(gap, 0.5))
            self._last_beat[rank] = ts

    def rank_of(self, node: str, pid: int) -> int | None:
        """The rank that process ``pid`` on ``node`` reported as (``None``: unknown)."""
        return self._pids.get((node, pid))

    def silent_after(self) -> float:
        """How long without a record makes a rank silent: a few beat intervals."""
        return max(self.min_silent_s, self.silent_beats * (self._beat_s or BEAT_S))

    def silent(self, now: float) -> list[tuple[int, str, float]]:
        """Ranks silent at ``now`` while some peer is not: ``(rank, node, last seen)``.

        Empty when the probe does not beat (nothing tells a silent rank from a busy one), when
        fewer than two ranks are known, or when every rank is silent (the job stopped as a whole:
        nothing singles a rank out).
        """
        if not self.beats or len(self._seen) < 2:
            return []
        cutoff = now - self.silent_after()
        quiet = [(rank, node, ts) for rank, (ts, node) in self._seen.items() if ts < cutoff]
        if not quiet or len(quiet) == len(self._seen):
            return []
        return sorted(quiet)

    def ranks(self) -> set[int]:
        """The ranks seen so far."""
        return set(self._seen)

    def nodes(self) -> set[str]:
        """The nodes the ranks seen so far run on."""
        return {node for _, node in self._seen.values()}

    def forget(self) -> None:
        """The job (re)started: new processes, new ids."""
        self._seen.clear()
        self._pids.clear()
        self._last_beat.clear()
