"""Crash detection from fatal log lines, with cascade grouping.

Root errors (an Xid, a CUDA error, an OOM) raise an anomaly at once. Cascade
errors — the NCCL watchdog timeouts and rendezvous failures that *every* rank
prints after one rank died — are held for ``cascade_hold_s`` of event time, so
that a root error arriving in that window names the incident instead. Grouping
of later lines into an open incident is the job monitor's business.

>>> from detectors.events import LogRecord
>>> det = CrashDetector(cascade_hold_s=10)
>>> line = "[rank3]: Watchdog caught collective operation timeout: WorkNCCL(SeqNum=5, OpType=ALLREDUCE)"
>>> det.observe(LogRecord(ts=100.0, job_id="7", node="n1", rank=3, line=line))
[]
>>> [f.category for f in det.advance(110.0)]
['nccl_timeout']
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from detectors.events import LogRecord
from detectors.ids import evidence_line
from detectors.signatures import SignatureMatch, match_line


@dataclass(slots=True)
class Finding:
    """A detector's claim before incident grouping turns it into an :class:`Anomaly`."""

    kind: str
    category: str
    layer: str
    onset_ts: float
    detected_at: float
    transient: bool | None = None
    nodes: list[str] = field(default_factory=list)
    ranks: list[int] = field(default_factory=list)
    gpus: list[str] = field(default_factory=list)
    confidence: float = 0.5
    evidence: list[str] = field(default_factory=list)
    cascade: bool = False
    signature: str = ""


def finding_from_line(record: LogRecord, match: SignatureMatch) -> Finding:
    sig = match.signature
    gpus = [f"{record.node}:{match.fields['pci']}"] if "pci" in match.fields else []
    rank = record.rank if record.rank is not None else (int(match.fields["rank"]) if "rank" in match.fields else None)
    return Finding(
        kind=sig.kind,
        category=sig.category,
        layer=sig.layer,
        onset_ts=record.ts,  # type: ignore[arg-type]
        detected_at=record.ts,  # type: ignore[arg-type]
        transient=sig.transient,
        nodes=[record.node],
        ranks=[rank] if rank is not None else [],
        gpus=gpus,
        confidence=0.5 if sig.cascade else 0.9,
        evidence=[evidence_line(record.node, record.rank, record.line)],
        cascade=sig.cascade,
        signature=sig.id,
    )


MAX_HELD = 64  # cascade lines kept whole while waiting for a root cause


class CrashDetector:
    """Fatal log lines → findings; cascade lines wait for a root cause."""

    def __init__(self, cascade_hold_s: float = 10.0) -> None:
        self.cascade_hold_s = cascade_hold_s
        self._held: list[Finding] = []
        self._held_extra = 0
        self._held_nodes: set[str] = set()
        self._held_ranks: set[int] = set()
        self._storms: dict[str, deque[float]] = {}

    def _clear_overflow(self) -> None:
        self._held_extra = 0
        self._held_nodes = set()
        self._held_ranks = set()

    def observe(self, record: LogRecord) -> list[Finding]:
        match = match_line(record.line)
        if match is None:
            return []
        return self.observe_match(record, match)

    def observe_match(self, record: LogRecord, match: SignatureMatch) -> list[Finding]:
        """Like :meth:`observe`, for a line already matched against the catalogue."""
        if match.signature.severity == "warning":
            return self._storm(record, match)
        finding = finding_from_line(record, match)
        if finding.cascade:
            # A 1,000-node job times out on every rank at once: keep the first lines as
            # evidence, and only the places of the rest, so memory stays bounded.
            if len(self._held) < MAX_HELD:
                self._held.append(finding)
            else:
                self._held_extra += 1
                self._held_nodes.update(finding.nodes)
                self._held_ranks.update(finding.ranks)
            return []
        held, self._held = self._held, []
        self._clear_overflow()
        for cascade in held[:5]:
            finding.evidence.extend(cascade.evidence[:1])
        return [finding]

    def _storm(self, record: LogRecord, match: SignatureMatch) -> list[Finding]:
        """Warnings matter in storms: ``storm`` lines within ``storm_window_s``, reported once per window."""
        sig = match.signature
        ts: float = record.ts  # type: ignore[assignment]
        times = self._storms.get(sig.id)
        if times is None:
            times = self._storms[sig.id] = deque()
        times.append(ts)
        while times and times[0] < ts - sig.storm_window_s:
            times.popleft()
        if sig.storm <= 0 or len(times) < sig.storm:
            return []
        finding = finding_from_line(record, match)
        finding.onset_ts = times[0]
        finding.evidence.append(f"{len(times)} such lines within {sig.storm_window_s:g}s")
        times.clear()
        return [finding]

    def advance(self, watermark: float) -> list[Finding]:
        if not self._held or watermark < self._held[0].onset_ts + self.cascade_hold_s:
            return []
        return self.flush(watermark)

    def flush(self, now: float) -> list[Finding]:
        """Report the held cascade now (the job has ended: no root error is coming)."""
        if not self._held:
            return []
        held, self._held = self._held, []
        first = min(held, key=lambda f: f.onset_ts)
        first.detected_at = now
        first.nodes = sorted({n for f in held for n in f.nodes} | self._held_nodes)
        first.ranks = sorted({r for f in held for r in f.ranks} | self._held_ranks)
        first.evidence = [e for f in held[:5] for e in f.evidence]
        lines = len(held) + self._held_extra
        first.evidence.append(f"{lines} cascade line(s) and no root error within {self.cascade_hold_s:g}s")
        self._clear_overflow()
        return [first]

    def reset(self) -> None:
        self._held.clear()
        self._clear_overflow()
        self._storms.clear()
