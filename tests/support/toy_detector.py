"""A detector written outside trainguard, to show that one plugs in through ``detectors.plugins``."""

from __future__ import annotations

from trainguard.detectors.events import Event, LogRecord
from trainguard.detectors.findings import Finding
from trainguard.detectors.settings import DetectorSettings


class SilentRank:
    """A rank that printed once and then nothing for ``quiet_s`` while others keep printing."""

    def __init__(self, job_id: str, settings: DetectorSettings, quiet_s: float = 30.0) -> None:
        self.job_id = job_id
        self.quiet_s = quiet_s
        self.last: dict[int, float] = {}
        self.reported: set[int] = set()

    def observe(self, event: Event) -> list[Finding]:
        if isinstance(event, LogRecord) and event.rank is not None:
            self.last[event.rank] = float(event.ts)  # type: ignore[arg-type]
        return []

    def advance(self, watermark: float) -> list[Finding]:
        newest = max(self.last.values(), default=watermark)
        found = []
        for rank, ts in sorted(self.last.items()):
            if rank not in self.reported and newest - ts >= self.quiet_s:
                self.reported.add(rank)
                found.append(
                    Finding("hang", "silent_rank", "unknown", ts, watermark, ranks=[rank], evidence=[f"rank {rank}"])
                )
        return found


def silent_rank(job_id: str, settings: DetectorSettings) -> SilentRank:
    return SilentRank(job_id, settings)


class Broken:
    """A plugin with a bug: it raises on the third event it sees."""

    def __init__(self, job_id: str, settings: DetectorSettings) -> None:
        self.seen = 0

    def observe(self, event: Event) -> list[Finding]:
        self.seen += 1
        if self.seen == 3:
            raise KeyError("oops")
        return []

    def advance(self, watermark: float) -> list[Finding]:
        return []
