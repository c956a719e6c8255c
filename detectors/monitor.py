"""Per-key monitors: everything one job (or one idle node) needs, in one object.

A monitor is the state behind one key of the dataflow. It feeds events to its
detectors, localises their findings (per-rank scores, GPU peer comparison),
turns them into anomalies — grouping one incident's many lines into one
anomaly — and says when it may be forgotten. Monitors are plain picklable
objects, so Bytewax can snapshot them for recovery.

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
from detectors.crash import CrashDetector
from detectors.events import Anomaly, Event, GpuSample, JobEvent, LogRecord, NodeEvent, ProgressRecord
from detectors.findings import Finding
from detectors.gpu_health import GpuHealth
from detectors.gpu_peers import GpuPeers
from detectors.hang import HangDetector
from detectors.ids import anomaly_id, evidence_line
from detectors.phases import phase_marker
from detectors.progress_parsers import parse_nvrx_score, parse_progress
from detectors.rank_scores import RankScorer
from detectors.settings import DetectorSettings
from detectors.signatures import match_line
from detectors.straggler import StragglerDetector

RUNNING_STATES = frozenset({"RUNNING", "CONFIGURING", "COMPLETING"})
WAITING_STATES = frozenset({"PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "SUSPENDED", "RESIZING"})
FAILED_STATES: dict[str, tuple[str, str]] = {
    "FAILED": ("job_failed", "unknown"),
    "NODE_FAIL": ("node_fail", "hardware"),
    "OUT_OF_MEMORY": ("host_oom", "application"),
    "BOOT_FAIL": ("node_fail", "hardware"),
}
INCIDENT_KINDS = frozenset({"crash", "hang"})
SLOWDOWN_CATEGORIES = frozenset({"thermal_throttle", "power_brake", "hw_slowdown"})
NIC_EVIDENCE_S = 1800.0  # a NIC degradation this recent can explain a slowdown
LOST_GPU_CHECK_S = 30.0  # GPUs report every ~10 s; looking for silent ones more often finds nothing new


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
        severity=f.severity,  # type: ignore[arg-type]
        remedy=f.remedy,
    )


@dataclass(slots=True)
class _Incident:
    anomaly_id: str
    last_ts: float


class JobMonitor:
    """Crash, hang, straggler, numerics and GPU-health detection for one job."""

    def __init__(self, job_id: str, settings: DetectorSettings | None = None) -> None:
        s = settings or DetectorSettings()
        st = s.straggler
        self.job_id = job_id
        self.scope = f"job/{job_id}"
        self.settings = s
        self.nodes: list[str] = []
        self.crash = CrashDetector(s.crash.cascade_hold_s)
        self.hang = HangDetector(**_fields(s.hang))
        self.straggler = StragglerDetector(st.ratio, st.consecutive, st.baseline_steps, st.warmup_steps)
        self.ranks = RankScorer(st.rank_threshold, st.rank_window, st.rank_consecutive)
        self.gpus = GpuPeers(z_threshold=st.peer_z)
        self.health = GpuHealth(s.gpu)
        self._incident: _Incident | None = None
        self._quiet_until: dict[str, float] = {}  # kind/category -> end of its dedupe window
        self._max_step = -1
        self._last_step_ts: float | None = None
        self._phase_since_step = False
        self._nvrx_section = "relative"
        self._nic_warnings: dict[str, float] = {}  # node -> last NIC link degradation line
        self.ended_at: float | None = None
        self._next_lost_check = float("-inf")
        self._next_rank_eval = float("-inf")

    # -- events -------------------------------------------------------------------
    def observe(self, event: Event) -> list[Anomaly]:
        if isinstance(event, ProgressRecord):
            per_rank = event.compute_time_s if event.compute_time_s is not None else event.step_time_s
            return self._progress(event.ts, event.step, event.rank, event.node, event.step_time_s, per_rank)  # type: ignore[arg-type]
        if isinstance(event, LogRecord):
            return self._log(event)
        if isinstance(event, GpuSample):
            return self._gpu(event)
        if isinstance(event, JobEvent):
            return self._job_state(event)
        return []

    def _log(self, rec: LogRecord) -> list[Anomaly]:
        ts: float = rec.ts  # type: ignore[assignment]
        parsed = parse_progress(rec.line)
        if parsed is not None:
            found = self._progress(ts, parsed.step, rec.rank, rec.node, parsed.step_time_s, None)
            if parsed.nonfinite:
                match = match_line(rec.line)
                if match is not None:
                    found += self._emit(self.crash.observe_match(rec, match))
            return found
        score = parse_nvrx_score(rec.line)
        if score is not None:
            return self._nvrx(ts, score.rank, score.node, score.score, rec)
        if "performance:" in rec.line and "NVRx" in rec.line:
            self._nvrx_section = "individual" if "individual" in rec.line else "relative"
            return []
        marker = phase_marker(rec.line)
        if marker is not None:
            self.hang.observe_phase(ts, starts=marker[1])
            self._phase_since_step = True
            return []
        match = match_line(rec.line)
        if match is None:
            self.crash.observe_unmatched(rec)
            return []
        if match.signature.category == "nic_degraded":
            self._nic_warnings[rec.node] = ts  # evidence for localising a slowdown, not an anomaly by itself
        return self._emit(self.crash.observe_match(rec, match))

    def _progress(
        self, ts: float, step: int | None, rank: int | None, node: str, step_time: float | None, per_rank: float | None
    ) -> list[Anomaly]:
        if self.ended_at is not None:
            return []
        if step is None:  # progress without a step number: count it ourselves
            step = self._max_step + 1
        self.hang.observe_progress(ts, step, rank, node)
        if per_rank is not None and rank is not None:
            self.ranks.observe(rank, node, per_rank)
        if step < self._max_step:  # restarted from a checkpoint
            self.straggler.restart()
            self.ranks.reset()
            self._max_step, self._last_step_ts = step, ts
            return []
        if step == self._max_step:
            return []
        if self.crash.fatal_pending:
            self.crash.discard_unclassified()  # the job went on: those lines were not fatal
        found: list[Finding] = []
        if step_time is None and self._last_step_ts is not None and self._max_step >= 0:
            step_time = (ts - self._last_step_ts) / (step - self._max_step)
        if step_time is not None and not self._phase_since_step:
            finding = self.straggler.observe_step(ts, step_time)
            if finding is not None:
                found.append(self._localise_straggler(finding))
        if ts >= self._next_rank_eval:
            # Scoring every rank costs O(ranks); once per rank_eval_s of event time is plenty.
            self._next_rank_eval = ts + self.settings.straggler.rank_eval_s
            rank_finding = self.ranks.evaluate(ts)
            if rank_finding is not None:
                found.append(rank_finding)
        self._max_step, self._last_step_ts = step, ts
        self._phase_since_step = False
        return self._emit(found)

    def _nvrx(self, ts: float, rank: int, node: str, score: float, rec: LogRecord) -> list[Anomaly]:
        """A rank's score from NVRx's own straggler report."""
        if score >= self.settings.straggler.rank_threshold:
            return []
        finding = Finding(
            "straggler",
            "slow_rank",
            "unknown",
            ts,
            ts,
            nodes=[node],
            ranks=[rank],
            confidence=0.8,
            evidence=[
                f"NVRx {self._nvrx_section} score {score:.2f} for rank {rank} on {node}",
                evidence_line(rec.node, rec.rank, rec.line),
            ],
        )
        return self._emit([finding])

    def _gpu(self, sample: GpuSample) -> list[Anomaly]:
        self.gpus.observe(sample)
        return self._emit(self.health.observe(sample))

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
        if state not in FAILED_STATES and state != "COMPLETED":
            # Cancelled, timed out, preempted: what was held is still this job's story.
            return self._emit(self.crash.flush(ts) or self.crash.unclassified(ts))
        if state in FAILED_STATES:
            category, layer = FAILED_STATES[state]
            evidence = [
                f"scheduler: job {self.job_id} {state}"
                + (f" exit code {ev.exit_code}" if ev.exit_code is not None else "")
            ]
            # Cascade lines held when the job dies are its best-known cause (a lone NCCL timeout, say).
            held = self.crash.flush(ts) or self.crash.unclassified(ts)
            for finding in held:
                finding.evidence.extend(evidence)
            return self._emit(held or [Finding("crash", category, layer, ts, ts, confidence=0.6, evidence=evidence)])
        return []

    def _start(self, ts: float) -> None:
        self.ended_at = None
        self.hang.restart(ts)
        self.straggler.restart()
        self.ranks.reset()
        self.crash.reset()
        self._incident = None
        self._quiet_until.clear()
        self._max_step, self._last_step_ts = -1, None

    # -- localisation -------------------------------------------------------------------
    def _localise_straggler(self, f: Finding) -> Finding:
        slowest = self.ranks.slowest()
        if slowest is not None and slowest[2] < self.settings.straggler.localise_below:
            rank, node, score = slowest
            f.category, f.ranks, f.nodes, f.confidence = "slow_rank", [rank], [node], 0.85
            f.evidence.append(f"rank {rank} on {node} is slowest (relative score {score:.2f})")
            return f
        slow_nics = sorted(
            n for n, ts in self._nic_warnings.items() if f.onset_ts - NIC_EVIDENCE_S <= ts <= f.detected_at
        )
        if slow_nics:
            f.category, f.nodes, f.confidence = "slow_nic", slow_nics, 0.75
            f.evidence.append(f"NIC link degraded on {', '.join(slow_nics)} (kernel log)")
            return f
        odd = self.gpus.odd_one_out()
        if odd:
            f.category, f.confidence = "slow_gpu", 0.75
            f.nodes = sorted({node for node, _ in odd})
            f.gpus = [f"{node}/{gpu}" for node, gpu in odd]
            f.evidence.append(f"odd one out among the job's GPUs (clock, heat, power, throttling): {', '.join(f.gpus)}")
        return f

    def _localise_hang(self, f: Finding) -> None:
        if f.nodes:
            return
        gone = [(node, gpu) for node, gpu, _ in self.gpus.missing(f.detected_at, self.settings.gpu.missing_after_s)]
        idle = self.gpus.idle_while_peers_spin()
        suspects = gone or idle
        if suspects:
            f.nodes = sorted({node for node, _ in suspects})
            f.gpus = [f"{node}/{gpu}" for node, gpu in suspects]
            f.confidence = 0.75
            why = "stopped reporting" if gone else "idle while peers spin in NCCL kernels"
            f.evidence.append(f"GPU {', '.join(f.gpus)} {why}")
        elif self.nodes:
            f.evidence.append(f"job nodes: {', '.join(self.nodes[:16])}")

    # -- clock ------------------------------------------------------------------------
    def advance(self, watermark: float) -> list[Anomaly]:
        found = self.crash.advance(watermark)
        hang = self.hang.advance(watermark)
        if hang is not None and self.crash.fatal_pending:
            found += self.crash.unclassified(watermark)  # the job stopped after lines no signature explains
        elif hang is not None:
            self._localise_hang(hang)
            found.append(hang)
        if self.ended_at is None and watermark >= self._next_lost_check:
            self._next_lost_check = watermark + LOST_GPU_CHECK_S
            found += self.health.lost(self.gpus.missing(watermark, self.settings.gpu.missing_after_s), watermark)
        return self._emit(found)

    def end_of_input(self, watermark: float) -> list[Anomaly]:
        """The input ended (end of a replay, clean shutdown): release what waits on the clock.

        Held cascades are reported as the hold would have reported them (detected when the hold
        expires), and fatal-looking lines no signature explains as ``crash/unclassified``. No hang
        or straggler is declared: the data stopping is not the job stopping.
        """
        found = self.crash.flush_expired()
        if self.ended_at is None:
            found += self.crash.unclassified(watermark)
        return self._emit(found)

    def finished(self, watermark: float) -> bool:
        return self.ended_at is not None and watermark > self.ended_at + self.settings.linger_s

    # -- grouping --------------------------------------------------------------------------
    def _emit(self, findings: list[Finding]) -> list[Anomaly]:
        out: list[Anomaly] = []
        for f in findings:
            inc = self._incident
            # A GPU's counters moving during a crash are that crash's evidence, not news.
            if (
                (f.kind in INCIDENT_KINDS or f.kind == "gpu_degraded")
                and inc is not None
                and (f.onset_ts <= inc.last_ts + self.settings.crash.group_window_s)
            ):
                inc.last_ts = max(inc.last_ts, f.detected_at)
                continue
            if f.kind not in INCIDENT_KINDS:
                # One straggler / numerics / degradation report per episode, not per step;
                # a GPU throttling under a reported straggler is that straggler's cause.
                if f.category in SLOWDOWN_CATEGORIES and f.detected_at < self._quiet_until.get("straggler", -1.0):
                    continue
                topic = f.kind if f.kind == "straggler" else f"{f.kind}/{f.category}/{','.join(f.gpus)}"
                if f.detected_at < self._quiet_until.get(topic, float("-inf")):
                    if f.kind == "numerics":  # NaNs on every step are one episode for as long as they last
                        self._quiet_until[topic] = f.detected_at + self.settings.crash.group_window_s
                    continue
                s = self.settings
                window = s.straggler.cooldown_s if f.kind == "straggler" else s.crash.group_window_s
                self._quiet_until[topic] = f.detected_at + window
            anomaly = to_anomaly(self.scope, self.job_id, f)
            if f.kind in INCIDENT_KINDS:
                self._incident = _Incident(anomaly.anomaly_id, f.detected_at)
            out.append(anomaly)
        return out


class NodeMonitor:
    """GPU health and kernel errors of one node while no job runs on it."""

    def __init__(self, node: str, settings: DetectorSettings | None = None) -> None:
        s = settings or DetectorSettings()
        self.node = node
        self.scope = f"node/{node}"
        self.settings = s
        self.health = GpuHealth(s.gpu)
        self.gpus = GpuPeers(history=1)
        self.crash = CrashDetector(s.crash.cascade_hold_s)
        self.last_ts: float | None = None
        self.idle_evict_s = 3600.0

    def observe(self, event: Event) -> list[Anomaly]:
        self.last_ts = event.ts  # type: ignore[assignment]
        if isinstance(event, GpuSample):
            if self.gpus.last_ts and event.ts - self.gpus.last_ts > 2 * self.settings.gpu.missing_after_s:  # type: ignore[operator]
                # The node was away (running a job): old sightings and counter readings are stale.
                self.gpus = GpuPeers(history=1)
                self.health.forget_samples()
            self.gpus.observe(event)
            return [self._anomaly(f, event.job_id) for f in self.health.observe(event)]
        if isinstance(event, LogRecord):
            return [self._anomaly(f, event.job_id) for f in self.crash.observe(event)]
        # Slurm prints a base state and flags: "DOWN*", "IDLE+NOT_RESPONDING", "MIXED+FAIL".
        states = set(event.state.upper().rstrip("*").split("+")) if isinstance(event, NodeEvent) else set()
        if states & {"DOWN", "NOT_RESPONDING", "FAIL"}:
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
        found = self.crash.advance(watermark)
        found += self.health.lost(self.gpus.missing(watermark, self.settings.gpu.missing_after_s), watermark)
        return [self._anomaly(f, None) for f in found]

    def end_of_input(self, watermark: float) -> list[Anomaly]:
        """The input ended: report held kernel-log cascades as their hold would have."""
        return [self._anomaly(f, None) for f in self.crash.flush_expired()]

    def finished(self, watermark: float) -> bool:
        return self.last_ts is not None and watermark > self.last_ts + self.idle_evict_s

    def _anomaly(self, f: Finding, job_id: str | None) -> Anomaly:
        if job_id is None and f.kind in ("crash", "gpu_degraded"):
            # No job runs here: the node itself is the problem to act on.
            f.kind = "node_unhealthy"
        return to_anomaly(self.scope, job_id, f)


def _fields(struct: object) -> dict[str, object]:
    return {name: getattr(struct, name) for name in struct.__struct_fields__}  # type: ignore[attr-defined]
