"""Per-key monitors: everything one job (or one idle node) needs, in one object.

A monitor is the state behind one key of the dataflow. It feeds events to its
detectors, turns their findings into anomalies (grouping one incident's many
lines into one anomaly), and says when it may be forgotten. Monitors are plain
picklable objects, so Bytewax can snapshot them for recovery.

>>> from detectors.events import LogRecord, Tick
>>> mon = JobMonitor("7")
>>> [a.category for a in mon.observe(LogRecord(ts=10.0, job_id="7", node="n1", rank=0,
...     line="RuntimeError: CUDA error: an illegal memory access was encountered"))]
['cuda_illegal_address']
>>> mon.observe(LogRecord(ts=11.0, job_id="7", node="n2", rank=8,
...     line="RuntimeError: CUDA error: an illegal memory access was encountered"))
[]
"""

from __future__ import annotations

from dataclasses import dataclass

from detectors.attribution import attribute_layer
from detectors.crash import CrashDetector, Finding
from detectors.events import (
    Anomaly,
    Event,
    GpuSample,
    JobEvent,
    LogRecord,
    NodeEvent,
    ProgressRecord,
)
from detectors.gpu_health import GpuHealth, xid_findings
from detectors.hang import HangDetector
from detectors.ids import anomaly_id
from detectors.phases import phase_marker
from detectors.progress_parsers import parse_progress
from detectors.settings import DetectorSettings
from detectors.straggler import StragglerDetector

RUNNING_STATES = frozenset({"RUNNING", "CONFIGURING", "COMPLETING"})
WAITING_STATES = frozenset({"PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "SUSPENDED", "RESIZING"})
BENIGN_END_STATES = frozenset({"COMPLETED", "CANCELLED", "TIMEOUT", "PREEMPTED", "DEADLINE"})
FAILED_STATES: dict[str, tuple[str, str]] = {
    "FAILED": ("job_failed", "unknown"),
    "NODE_FAIL": ("node_fail", "hardware"),
    "OUT_OF_MEMORY": ("host_oom", "application"),
    "BOOT_FAIL": ("node_fail", "hardware"),
}


def to_anomaly(scope: str, job_id: str | None, f: Finding) -> Anomaly:
    layer, transient = attribute_layer(f.category, f.layer, f.transient)
    return Anomaly(
        anomaly_id=anomaly_id(scope, f.kind, f.category, f.onset_ts),
        detected_at=f.detected_at,
        onset_ts=f.onset_ts,
        kind=f.kind,
        category=f.category,
        layer=layer,
        transient=transient,
        job_id=job_id,
        nodes=f.nodes,
        ranks=f.ranks,
        gpus=f.gpus,
        confidence=f.confidence,
        evidence=f.evidence[:10],
    )


@dataclass(slots=True)
class _Incident:
    anomaly_id: str
    last_ts: float
    absorbed: int = 0


class JobMonitor:
    """Crash, hang and straggler detection for one job."""

    def __init__(self, job_id: str, settings: DetectorSettings | None = None) -> None:
        s = settings or DetectorSettings()
        self.job_id = job_id
        self.scope = f"job/{job_id}"
        self.settings = s
        self.nodes: list[str] = []
        self.crash = CrashDetector(s.crash.cascade_hold_s)
        self.hang = HangDetector(**_fields(s.hang))
        self.straggler = StragglerDetector(**_fields(s.straggler))
        self._incident: _Incident | None = None
        self._max_step = -1
        self._last_step_ts: float | None = None
        self._phase_since_step = False
        self.ended_at: float | None = None

    # -- events -------------------------------------------------------------------
    def observe(self, event: Event) -> list[Anomaly]:
        if isinstance(event, ProgressRecord):
            return self._progress(
                event.ts,
                event.step,
                event.rank,
                event.node,  # type: ignore[arg-type]
                event.step_time_s,
                event.compute_time_s,
            )
        if isinstance(event, LogRecord):
            return self._log(event)
        if isinstance(event, JobEvent):
            return self._job_state(event)
        if isinstance(event, GpuSample) and event.xid is not None:
            return self._emit(xid_findings(event))
        return []

    def _log(self, rec: LogRecord) -> list[Anomaly]:
        ts: float = rec.ts  # type: ignore[assignment]
        parsed = parse_progress(rec.line)
        if parsed is not None:
            return self._progress(ts, parsed.step, rec.rank, rec.node, parsed.step_time_s, None)
        marker = phase_marker(rec.line)
        if marker is not None:
            self.hang.observe_phase(ts, starts=marker[1])
            self._phase_since_step = True
            return []
        return self._emit(self.crash.observe(rec))

    def _progress(
        self, ts: float, step: int, rank: int | None, node: str, step_time: float | None, compute: float | None
    ) -> list[Anomaly]:
        if self.ended_at is not None:
            return []
        self.hang.observe_progress(ts, step, rank, node)
        if compute is not None and rank is not None:
            self.straggler.observe_compute(rank, node, compute)
        if step < self._max_step:  # restarted from a checkpoint
            self.straggler.restart()
            self._max_step, self._last_step_ts = step, ts
            return []
        if step == self._max_step:
            return []
        found: list[Finding] = []
        if step_time is None and self._last_step_ts is not None and self._max_step >= 0:
            step_time = (ts - self._last_step_ts) / (step - self._max_step)
        if step_time is not None and not self._phase_since_step:
            finding = self.straggler.observe_step(ts, step_time)
            if finding is not None:
                found.append(finding)
        self._max_step, self._last_step_ts = step, ts
        self._phase_since_step = False
        return self._emit(found)

    def _job_state(self, ev: JobEvent) -> list[Anomaly]:
        ts: float = ev.ts  # type: ignore[assignment]
        state = ev.state.upper()
        if ev.nodes:
            self.nodes = list(ev.nodes)
        if state in RUNNING_STATES:
            if state == "RUNNING":
                self._start(ts)
            return []
        if state in WAITING_STATES:
            self.hang.stop()
            return []
        self.ended_at = ts
        self.hang.stop()
        if state in FAILED_STATES:
            category, layer = FAILED_STATES[state]
            evidence = [
                f"scheduler: job {self.job_id} {state}"
                + (f" exit code {ev.exit_code}" if ev.exit_code is not None else "")
            ]
            return self._emit([Finding("crash", category, layer, ts, ts, nodes=[], confidence=0.6, evidence=evidence)])
        return []

    def _start(self, ts: float) -> None:
        self.ended_at = None
        self.hang.restart(ts)
        self.straggler.restart()
        self.crash.reset()
        self._incident = None
        self._max_step, self._last_step_ts = -1, None

    # -- clock ------------------------------------------------------------------------
    def advance(self, watermark: float) -> list[Anomaly]:
        found = self.crash.advance(watermark)
        hang = self.hang.advance(watermark)
        if hang is not None:
            if not hang.nodes and self.nodes:
                hang.evidence.append(f"job nodes: {', '.join(self.nodes[:16])}")
            found.append(hang)
        return self._emit(found)

    def finished(self, watermark: float) -> bool:
        return self.ended_at is not None and watermark > self.ended_at + self.settings.linger_s

    # -- grouping --------------------------------------------------------------------------
    def _emit(self, findings: list[Finding]) -> list[Anomaly]:
        out: list[Anomaly] = []
        for f in findings:
            if f.kind in ("crash", "hang"):
                inc = self._incident
                window = self.settings.crash.group_window_s
                if inc is not None and f.onset_ts <= inc.last_ts + window:
                    inc.last_ts = max(inc.last_ts, f.detected_at)
                    inc.absorbed += 1
                    continue
            anomaly = to_anomaly(self.scope, self.job_id, f)
            if f.kind in ("crash", "hang"):
                self._incident = _Incident(anomaly.anomaly_id, f.detected_at)
            out.append(anomaly)
        return out


class NodeMonitor:
    """GPU health and kernel errors of one node, with or without a job on it."""

    def __init__(self, node: str, settings: DetectorSettings | None = None) -> None:
        s = settings or DetectorSettings()
        self.node = node
        self.scope = f"node/{node}"
        self.health = GpuHealth(s.gpu_cooldown_s)
        self.crash = CrashDetector(s.crash.cascade_hold_s)
        self.last_ts: float | None = None
        self.idle_evict_s = 3600.0

    def observe(self, event: Event) -> list[Anomaly]:
        self.last_ts = event.ts  # type: ignore[assignment]
        if isinstance(event, GpuSample):
            return [self._anomaly(f, event.job_id) for f in self.health.observe(event)]
        if isinstance(event, LogRecord):
            return [self._anomaly(f, event.job_id) for f in self.crash.observe(event)]
        if isinstance(event, NodeEvent) and event.state.upper().rstrip("*") in ("DOWN", "NOT_RESPONDING", "FAIL"):
            f = Finding(
                "node_unhealthy",
                "node_down",
                "hardware",
                event.ts,
                event.ts,  # type: ignore[arg-type]
                nodes=[self.node],
                confidence=0.7,
                evidence=[f"scheduler: node {self.node} {event.state}: {event.reason or ''}".strip()],
            )
            return [self._anomaly(f, event.job_id)]
        return []

    def advance(self, watermark: float) -> list[Anomaly]:
        return [self._anomaly(f, None) for f in self.crash.advance(watermark)]

    def finished(self, watermark: float) -> bool:
        return self.last_ts is not None and watermark > self.last_ts + self.idle_evict_s

    def _anomaly(self, f: Finding, job_id: str | None) -> Anomaly:
        if job_id is None and f.kind in ("crash", "gpu_degraded"):
            # No job runs here: the node itself is the problem to act on.
            f.kind = "node_unhealthy"
        return to_anomaly(self.scope, job_id, f)


def _fields(struct: object) -> dict[str, object]:
    return {name: getattr(struct, name) for name in struct.__struct_fields__}  # type: ignore[attr-defined]
