"""Crash detection from fatal log lines, with cascade grouping.

Root errors (an Xid, a CUDA error, an OOM) raise an anomaly at once. Cascade
errors — the NCCL watchdog timeouts and rendezvous failures that *every* rank
prints after one rank died — are held for ``cascade_hold_s`` of event time, so
that a root error arriving in that window names the incident instead. Grouping
of later lines into an open incident is the job monitor's business.

Nothing that looks fatal is dropped: a line that matches no signature but looks
like a failure (an uncaught exception, ``terminate called``, a failed assertion)
is kept, and :meth:`CrashDetector.unclassified` reports it as
``crash/unclassified`` when the job then stops or ends.

>>> from trainguard.detectors.events import LogRecord
>>> det = CrashDetector(cascade_hold_s=10)
>>> line = "[rank3]: Watchdog caught collective operation timeout: WorkNCCL(SeqNum=5, OpType=ALLREDUCE)"
>>> det.observe(LogRecord(ts=100.0, job_id="7", node="n1", rank=3, line=line))
[]
>>> [f.category for f in det.advance(110.0)]
['nccl_timeout']
"""

from __future__ import annotations

from collections import deque

from trainguard.detectors.events import Event, LogRecord
from trainguard.detectors.findings import Finding, count_recent
from trainguard.detectors.ids import evidence_line, gpu_id, pci_address
from trainguard.detectors.signatures import SignatureMatch, looks_fatal, match_line


def finding_from_line(record: LogRecord, match: SignatureMatch) -> Finding:
    sig = match.signature
    pci = match.fields.get("pci", "")
    gpus = [gpu_id(record.node, pci_address(pci))] if pci.count(":") >= 1 else []
    rank = record.rank if record.rank is not None else (int(match.fields["rank"]) if "rank" in match.fields else None)
    evidence = [evidence_line(record.node, record.rank, record.line)]
    if "cause_xid" in match.fields:
        evidence.append(f"the line names Xid {match.fields['cause_xid']} as its cause")
    if "signal" in match.fields:
        evidence.append(f"exit code {match.fields['exit_code']}: killed by {match.fields['signal']}")
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
        confidence=0.5 if sig.cascade or sig.weak else 0.9,
        evidence=evidence,
        cascade=sig.cascade,
        signature=sig.id,
        severity="warning" if sig.notice else "critical",
        remedy=sig.remedy,
    )


MAX_HELD = 64  # cascade lines kept whole while waiting for a root cause
MAX_UNCLASSIFIED = 16  # fatal-looking lines kept while waiting to see whether the job stops


class CrashDetector:
    """Fatal log lines → findings; cascade lines wait for a root cause."""

    def __init__(self, cascade_hold_s: float = 10.0) -> None:
        self.cascade_hold_s = cascade_hold_s
        self._held: list[Finding] = []
        self._held_extra = 0
        self._held_nodes: set[str] = set()
        self._held_ranks: set[int] = set()
        self._storms: dict[tuple[str, str], deque[float]] = {}
        self._fatal_lines: list[LogRecord] = []

    def __setstate__(self, state: dict[str, object]) -> None:
        # Snapshots of earlier versions resume: no unclassified lines yet, and storms were keyed by
        # signature alone (such counts restart; storms keyed by signature and device are kept).
        state.setdefault("_fatal_lines", [])
        storms: dict[object, object] = state.get("_storms", {})  # type: ignore[assignment]
        state["_storms"] = {k: v for k, v in storms.items() if isinstance(k, tuple)}
        self.__dict__.update(state)

    def _clear_overflow(self) -> None:
        self._held_extra = 0
        self._held_nodes = set()
        self._held_ranks = set()

    def observe(self, event: Event) -> list[Finding]:
        """A log line (other events are not this detector's): its findings, or none while it is held."""
        if not isinstance(event, LogRecord):
            return []
        record = event
        match = match_line(record.line)
        if match is None:
            self.observe_unmatched(record)
            return []
        return self.observe_match(record, match)

    def observe_unmatched(self, record: LogRecord) -> bool:
        """A line no signature explains: keep it if it looks fatal (and say whether it does)."""
        fatal = looks_fatal(record.line)
        if fatal and len(self._fatal_lines) < MAX_UNCLASSIFIED:
            self._fatal_lines.append(record)
        return fatal

    def observe_match(self, record: LogRecord, match: SignatureMatch) -> list[Finding]:
        """Like :meth:`observe`, for a line already matched against the catalogue."""
        sig = match.signature
        if sig.severity == "warning":
            return self._storm(record, match)
        finding = finding_from_line(record, match)
        if finding.cascade or sig.weak:
            # A 1,000-node job times out on every rank at once: keep the first lines as
            # evidence, and only the places of the rest, so memory stays bounded. A bare
            # exception is held too: it is usually a cascade surfacing in Python, or the
            # header of a traceback whose next lines name the real error.
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
        self._fatal_lines.clear()  # explained
        return [finding]

    def _storm(self, record: LogRecord, match: SignatureMatch) -> list[Finding]:
        """Warnings matter in storms: ``storm`` lines within ``storm_window_s`` (per signature and device)."""
        sig = match.signature
        ts: float = record.ts  # type: ignore[assignment]
        key = (sig.id, f"{record.node}:{match.fields.get('pci', '')}")
        times = self._storms.setdefault(key, deque())
        if sig.storm <= 0 or count_recent(times, ts, sig.storm_window_s) < sig.storm:
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
        """Report the held cascade now (the hold expired, the job ended, or the input did)."""
        if not self._held:
            return []
        held, self._held = self._held, []
        cascades = [f for f in held if f.cascade] or held
        first = min(cascades, key=lambda f: f.onset_ts)
        first.detected_at = now
        first.nodes = sorted({n for f in held for n in f.nodes} | self._held_nodes)
        first.ranks = sorted({r for f in held for r in f.ranks} | self._held_ranks)
        first.evidence = [e for f in held[:5] for e in f.evidence]
        lines = len(held) + self._held_extra
        first.evidence.append(f"{lines} cascade line(s) and no root error within {self.cascade_hold_s:g}s")
        self._clear_overflow()
        self._fatal_lines.clear()
        return [first]

    def flush_expired(self) -> list[Finding]:
        """The input ended: report the held cascade as its hold would have, ``cascade_hold_s`` after it began."""
        if not self._held:
            return []
        return self.flush(self._held[0].onset_ts + self.cascade_hold_s)

    def discard_held(self) -> None:
        """The job is being stopped on request: what was held is the shutdown's noise, not a fault."""
        self._held.clear()
        self._clear_overflow()
        self._fatal_lines.clear()

    @property
    def holding(self) -> bool:
        """Cascade lines (or a bare exception) wait for their root cause."""
        return bool(self._held)

    @property
    def fatal_pending(self) -> bool:
        """Fatal-looking lines no signature explained are waiting (see :meth:`unclassified`)."""
        return bool(self._fatal_lines)

    def discard_unclassified(self) -> None:
        """The job went on after them: those lines were not fatal after all."""
        self._fatal_lines.clear()

    def discard_weak(self, rank: int | None) -> None:
        """``rank`` stepped on: a bare exception it printed (or one printed without a rank) and held for
        its cause was handled — logged, retried — not fatal. Another rank's exception stays held: the
        rank that raised it may be dead while the others take their last steps. Cascades stay held too.

        >>> det = CrashDetector()
        >>> det.observe(LogRecord(ts=5.0, job_id="7", node="n1", rank=3, line="ConnectionError: timed out"))
        []
        >>> det.discard_weak(rank=0); len(det.flush(60.0))
        1
        >>> det.observe(LogRecord(ts=70.0, job_id="7", node="n1", rank=3, line="ConnectionError: timed out"))
        []
        >>> det.discard_weak(rank=3); det.flush(90.0)
        []
        """
        if self._held:  # called on every step: nothing to do almost always
            self._held = [f for f in self._held if f.cascade or (f.ranks and rank not in f.ranks)]

    def unclassified(self, now: float) -> list[Finding]:
        """The job stopped or ended after fatal-looking lines no signature explains: report them.

        >>> det = CrashDetector()
        >>> det.observe(LogRecord(ts=5.0, job_id="7", node="n1", line="terminate called after throwing 'X'"))
        []
        >>> [(f.category, f.layer) for f in det.unclassified(60.0)]
        [('unclassified', 'unknown')]
        """
        if not self._fatal_lines:
            return []
        lines, self._fatal_lines = self._fatal_lines, []
        first = lines[0]
        return [
            Finding(
                kind="crash",
                category="unclassified",
                layer="unknown",
                onset_ts=first.ts,  # type: ignore[arg-type]
                detected_at=now,
                nodes=sorted({r.node for r in lines}),
                ranks=sorted({r.rank for r in lines if r.rank is not None}),
                confidence=0.4,
                evidence=[evidence_line(r.node, r.rank, r.line) for r in lines[:8]]
                + ["no catalogue signature explains these lines; the job stopped after them"],
                signature="unclassified",
            )
        ]

    def reset(self) -> None:
        self._held.clear()
        self._clear_overflow()
        self._storms.clear()
        self._fatal_lines.clear()
