"""Per-key monitors: everything one job (or one idle node) needs, in one object.

A monitor is the state behind one key of the dataflow. It feeds events to its
detectors, localises their findings (per-rank scores, GPU peer comparison),
hands them to :class:`~detectors.incidents.Incidents` (grouping, lifecycle) and
says when it may be forgotten. Anomalies resolve when progress resumes, the job
ends or restarts, or the node returns to service. Monitors are plain picklable
objects, so Bytewax can snapshot them for recovery.

>>> from trainguard.detectors.events import LogRecord, Tick
>>> mon = JobMonitor("7")
>>> [a.category for a in mon.observe(LogRecord(ts=10.0, job_id="7", node="n1", rank=0,
...     line="RuntimeError: CUDA error: an illegal memory access was encountered"))]
['cuda_illegal_address']
>>> mon.observe(LogRecord(ts=11.0, job_id="7", node="n2", rank=8,
...     line="RuntimeError: CUDA error: an illegal memory access was encountered"))
[]
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from typing import Any

import msgspec

from trainguard.detectors import job_states
from trainguard.detectors.crash import CrashDetector
from trainguard.detectors.events import (
    Anomaly,
    Event,
    GpuSample,
    JobEvent,
    LogRecord,
    NodeEvent,
    ProgressRecord,
    StacksRecord,
)
from trainguard.detectors.findings import Finding
from trainguard.detectors.frames import GpuFrame, as_frame
from trainguard.detectors.gpu_activity import GpuActivity, Verdict
from trainguard.detectors.gpu_health import GpuHealth
from trainguard.detectors.gpu_peers import GpuPeers
from trainguard.detectors.hang import HangDetector
from trainguard.detectors.hang_stacks import HangStacks
from trainguard.detectors.ids import GpuNames, evidence_line
from trainguard.detectors.incidents import INCIDENT_KINDS, Incidents, resolved, to_anomaly
from trainguard.detectors.lifecycle import JOB_ENDED, JOB_RESTARTED, NODE_RETURNED, PROGRESS_RESUMED
from trainguard.detectors.lines import (
    WRAP_MIN_CHARS,
    Matched,
    NvrxScore,
    NvrxSection,
    PhaseMarker,
    Progress,
    Rhythm,
    Stopped,
    read_line,
    rejoin_wrapped,
)
from trainguard.detectors.liveness import Liveness
from trainguard.detectors.localise import localise_hang, localise_straggler
from trainguard.detectors.protocol import Detector, load_factory
from trainguard.detectors.rank_scores import RankScorer
from trainguard.detectors.settings import DetectorSettings
from trainguard.detectors.signatures import KILLED_PREFIX, SignatureMatch
from trainguard.detectors.straggler import StragglerDetector
from trainguard.detectors.templates import ErrorTemplates, TemplateHit

__all__ = ["FAILED_STATES", "RUNNING_STATES", "WAITING_STATES", "JobMonitor", "NodeMonitor", "to_anomaly"]

# One definition of job states (detectors.job_states), under the names this module exported.
RUNNING_STATES = job_states.RUNNING
WAITING_STATES = job_states.WAITING
FAILED_STATES = job_states.FAILED
_log = logging.getLogger(__name__)
LOST_GPU_CHECK_S = 30.0  # GPUs report every ~10 s; looking for silent ones more often finds nothing new


class JobMonitor:
    """Crash, hang, straggler, numerics and GPU-health detection for one job.

    The built-in detectors share the job's step clock, so the monitor feeds them what each
    needs (a step, a step time, a phase); detectors named under ``detectors.plugins``
    follow :class:`~trainguard.detectors.protocol.Detector` and see every event of the job.
    """

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
        self.activity = GpuActivity()
        self.health = GpuHealth(s.gpu, idle_drift=False)
        self.incidents = Incidents(self.scope, job_id, s.crash.group_window_s, st.cooldown_s)
        self.templates = ErrorTemplates()  # this job's error-line templates (drain3), for unexplained failures
        self.liveness = Liveness()  # each rank's last sign of life (steps and the probe's beats), and its pid
        self._stopped_at: float | None = None  # when the job was told to stop (scancel, SIGTERM to torchrun)
        self._fatal_templates: dict[int, TemplateHit] = {}  # templates of the fatal-looking lines now pending
        self._max_step = -1
        self._last_step_ts: float | None = None
        self._phase_since_step = False
        self._nvrx_section = "relative"
        self._nic_warnings: dict[str, float] = {}  # node -> last NIC link degradation line
        self._wrap_tail: LogRecord | None = None  # the last long unmatched line (its message may go on)
        self.ended_at: float | None = None
        self._next_lost_check = float("-inf")
        self._next_rank_eval = float("-inf")
        self.plugins: list[Detector] = [load_factory(spec)(job_id, s) for spec in s.plugins]
        self._gpu_names = GpuNames()
        self._stack_dumps = HangStacks()  # the job's py-spy dumps (``stacks`` records)

    def __setstate__(self, state: dict[str, object]) -> None:
        # A snapshot written before the anomaly lifecycle still resumes (an upgrade must not
        # cost the recovery directory): its grouping windows move into Incidents.
        if "incidents" not in state:
            s: DetectorSettings = state["settings"]  # type: ignore[assignment]
            incidents = Incidents(
                str(state["scope"]), str(state["job_id"]), s.crash.group_window_s, s.straggler.cooldown_s
            )
            incidents._quiet_until = dict(state.pop("_quiet_until", {}))  # type: ignore[call-overload]
            state.pop("_incident", None)
            state["incidents"] = incidents
        state.setdefault("activity", GpuActivity())
        state.setdefault("templates", ErrorTemplates())
        state.setdefault("_fatal_templates", {})
        state.setdefault("plugins", [])
        state.setdefault("_wrap_tail", None)
        state.setdefault("liveness", Liveness())
        state.setdefault("_stopped_at", None)
        state.setdefault("_gpu_names", GpuNames())  # (snapshots before 0.2 have none)
        state.setdefault("_stack_dumps", HangStacks())  # (nor before stack dumps)
        self.__dict__.update(state)

    # -- events -------------------------------------------------------------------
    def observe(self, event: Event | GpuFrame) -> list[Anomaly]:
        if isinstance(event, ProgressRecord):
            self.liveness.observe(event.ts, event.rank, event.node, event.pid, event.beat)  # type: ignore[arg-type]
            if event.beat:  # alive, not a step
                found = []
            else:
                if event.pp_stage is not None or event.dp_rank is not None:
                    self.ranks.place(event.rank, event.pp_stage, event.dp_rank)
                per_rank = event.compute_time_s if event.compute_time_s is not None else event.step_time_s
                found = self._progress(event.ts, event.step, event.rank, event.node, event.step_time_s, per_rank)  # type: ignore[arg-type]
        elif isinstance(event, LogRecord):
            found = self._log(event)
        elif type(event) is GpuFrame or isinstance(event, GpuSample):
            found = self._gpu(as_frame(event))  # type: ignore[arg-type]
        elif isinstance(event, JobEvent):
            found = self._job_state(event)
        elif isinstance(event, StacksRecord):
            self.stack_dumps.observe(event)  # attached to the open hang once the round settles (advance)
            found = []
        else:
            found = []
        if self.plugins:  # detectors named under detectors.plugins see every event (and take records) too
            for record in event.samples() if type(event) is GpuFrame else (event,):
                for plugin in self.plugins:
                    found += self._emit(self._run_plugin(plugin, plugin.observe, record))
        return found

    def _run_plugin(self, plugin: Detector, call: Callable[[Any], list[Finding]], arg: Any) -> list[Finding]:
        """A plugin's findings; a plugin that raises is switched off for this job (said once), never the job."""
        try:
            return call(arg)
        except Exception:  # someone else's code: whatever it raises must not stop this job's detection
            _log.exception(
                "detector plugin %s failed on job %s; switched off for this job", type(plugin).__name__, self.job_id
            )
            self.plugins = [p for p in self.plugins if p is not plugin]
            return []

    def _log(self, rec: LogRecord) -> list[Anomaly]:
        ts: float = rec.ts  # type: ignore[assignment]
        tail, self._wrap_tail = self._wrap_tail, None  # only the line just before can be wrapped onto this one
        reading = read_line(rec.line)
        if type(reading) is Progress:  # most lines: tested first, and unpacked without a class pattern's look-ups
            (step, step_time, _, _), fault = reading
            # (A printed step line is mostly a new step: straight to the general path.)
            found = self._job_progress(ts, step, rec.rank, rec.node, step_time, None)
            return found if fault is None else found + self._emit(self.crash.observe_match(rec, fault))
        match reading:
            case NvrxScore(score):
                return self._nvrx(ts, score.rank, score.node, score.score, rec)
            case NvrxSection(name):
                self._nvrx_section = name
                return []
            case PhaseMarker(starts):
                self.hang.observe_phase(ts, starts=starts)
                self._phase_since_step = True
                return []
            case Rhythm(name, every):
                self.hang.observe_rhythm(name, every)
                return []
            case Stopped(how, _) if not self._failing():
                return self._stopped(ts, how)
            case Stopped(_, fault) if fault is not None:  # the stop follows a failure: it is its aftermath
                return self._emit(self.crash.observe_match(rec, fault))
            case Matched(fault):
                if fault.signature.category == "nic_degraded":
                    self._nic_warnings[rec.node] = ts  # evidence for localising a slowdown, not an anomaly itself
                sig = fault.signature
                if self._stopped_at is not None and (sig.cascade or sig.weak or sig.id.startswith(KILLED_PREFIX)):
                    # The noise of a requested stop: survivors losing their peers, the launcher's report, a worker
                    # that ignored SIGTERM and was killed.
                    return []
                rec, fault = self._named(rec, fault)
                return self._emit(self.crash.observe_match(rec, fault))
            case _ if self._stopped_at is not None:
                return []
        wrapped = None if tail is None else rejoin_wrapped(tail, rec)
        if len(rec.line) >= WRAP_MIN_CHARS:
            self._wrap_tail = rec
        if wrapped is not None:
            joined, fault = wrapped
            return self._emit(self.crash.observe_match(joined, fault))
        fatal = self.crash.observe_unmatched(rec)
        hit = self.templates.observe(rec.line)
        if hit is not None and fatal and len(self._fatal_templates) < 8:
            self._fatal_templates.setdefault(hit.template_id, hit)
        return []

    def _named(self, rec: LogRecord, fault: SignatureMatch) -> tuple[LogRecord, SignatureMatch]:
        """A launcher's report of a process, with the rank that process reported as; a worker it says was
        killed while this job's incident is already open is that incident's aftermath (torchrun kills a
        hung rank once the others have failed), not a new root cause."""
        if rec.rank is None and "pid" in fault.fields:
            rank = self.liveness.rank_of(rec.node, int(fault.fields["pid"]))
            if rank is None and "local_rank" in fault.fields and self.liveness.nodes() <= {rec.node}:
                rank = int(fault.fields["local_rank"])  # one node: its local ranks are the job's ranks
            if rank is not None:
                rec = msgspec.structs.replace(rec, rank=rank)
        sig = fault.signature
        if sig.id.startswith(KILLED_PREFIX) and not sig.cascade and self.incidents.incident is not None:
            fault = SignatureMatch(dataclasses.replace(sig, cascade=True), fault.fields)
        return rec, fault

    def _failing(self) -> bool:
        """Whether something already failed in this job: cascade lines held, an incident open, fatal lines."""
        return self.crash.holding or self.crash.fatal_pending or self.incidents.incident is not None

    def _stopped(self, ts: float, how: str) -> list[Anomaly]:
        """The job was told to stop: it ends here, and what its processes print as they go is no fault."""
        if self._stopped_at is not None:
            return []
        self._stopped_at = ts
        self.ended_at = ts
        self.hang.stop()
        self.crash.discard_held()
        return self.incidents.resolve(ts, f"{JOB_ENDED} (stopped on request: {how})")

    def _progress(
        self, ts: float, step: int | None, rank: int | None, node: str, step_time: float | None, per_rank: float | None
    ) -> list[Anomaly]:
        # Both steps: they part when a step goes below zero (the hang detector restarts at -1, the job keeps
        # its own), and the general path must then decide.
        if step == self._max_step and step == self.hang.last_step and self.ended_at is None:
            return self._rank_progress(ts, rank, node, per_rank)
        return self._job_progress(ts, step, rank, node, step_time, per_rank)

    def _rank_progress(self, ts: float, rank: int | None, node: str, per_rank: float | None) -> list[Anomaly]:
        """Another rank at the step the job is already on (most per-rank records: every rank reports each
        step): the job did not advance, so only this rank's own state moves — what :meth:`_job_progress`
        does with such a record, without the rest."""
        self.hang.observe_rank(ts, rank, node)
        if per_rank is not None and rank is not None:
            self.ranks.observe(rank, node, per_rank)
        return []

    def _job_progress(
        self, ts: float, step: int | None, rank: int | None, node: str, step_time: float | None, per_rank: float | None
    ) -> list[Anomaly]:
        """Any progress record: the job may advance, restart from a checkpoint or stay where it is."""
        if self.ended_at is not None:
            return []
        if step is None:  # progress without a step number: count it ourselves
            step = self._max_step + 1
        stalled_since = self.hang.last_advance if self.hang.fired else None
        advanced = self.hang.observe_progress(ts, step, rank, node)
        resolved: list[Anomaly] = []
        if advanced and stalled_since is not None:
            # The job went on by itself: the hang alarm (and any crash it raised meanwhile) was not the end.
            resolved = self.incidents.resolve(
                ts, f"{PROGRESS_RESUMED} after {ts - stalled_since:.0f} s", INCIDENT_KINDS, opened_before=ts
            )
        if per_rank is not None and rank is not None:
            self.ranks.observe(rank, node, per_rank)
        if step < self._max_step:  # restarted from a checkpoint
            self.straggler.restart()
            self.ranks.reset()
            self._max_step, self._last_step_ts = step, ts
            return resolved
        if step == self._max_step:
            return resolved
        if self.crash.fatal_pending:
            self.crash.discard_unclassified()  # the job went on: those lines were not fatal
            self._fatal_templates.clear()
        self.crash.discard_weak(rank)  # ... nor was a bare exception this rank logged and handled
        found: list[Finding] = []
        if step_time is None and self._last_step_ts is not None and self._max_step >= 0:
            step_time = (ts - self._last_step_ts) / (step - self._max_step)
        if step_time is not None and not self._phase_since_step:
            finding = self.straggler.observe_step(ts, step_time)
            if finding is not None:
                st = self.settings.straggler
                found.append(localise_straggler(finding, self.ranks, self.gpus, self._nic_warnings, st.localise_below))
        if ts >= self._next_rank_eval:
            # Scoring every rank costs O(ranks); once per rank_eval_s of event time is plenty.
            self._next_rank_eval = ts + self.settings.straggler.rank_eval_s
            rank_finding = self.ranks.evaluate(ts)
            if rank_finding is not None:
                found.append(rank_finding)
        self._max_step, self._last_step_ts = step, ts
        self._phase_since_step = False
        return (resolved + self._emit(found)) if found else resolved

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

    def _stepping(self, ts: float) -> bool:
        """Whether the job was making steps at ``ts`` (its GPU samples then show its training power)."""
        last = self._last_step_ts
        if last is None or self.hang.fired or self._phase_since_step:
            return False
        return ts - last <= max(3.0 * (self.hang.interval() or 0.0), 15.0)

    @property
    def gpu_names(self) -> GpuNames:
        return self._gpu_names

    @property
    def stack_dumps(self) -> HangStacks:
        """The job's py-spy dumps (``stacks`` records)."""
        return self._stack_dumps

    def _gpu(self, frame: GpuFrame) -> list[Anomaly]:
        _learn_addresses(self.gpu_names, frame)
        self.gpus.observe(frame)
        self.activity.observe(frame, self._stepping(frame.ts))
        return self._emit(self.health.observe(frame))

    def _job_state(self, ev: JobEvent) -> list[Anomaly]:
        ts: float = ev.ts  # type: ignore[assignment]
        state = ev.state.upper()
        if ev.nodes:
            self.nodes = list(ev.nodes)
        if state in RUNNING_STATES:
            if state == "RUNNING":
                return self._start(ts)
            return []
        if state in WAITING_STATES:
            self.hang.stop()
            return []
        self.ended_at = ts
        self.hang.stop()
        found: list[Finding]
        if state in FAILED_STATES:
            category, layer = FAILED_STATES[state]
            evidence = [
                f"scheduler: job {self.job_id} {state}"
                + (f" exit code {ev.exit_code}" if ev.exit_code is not None else "")
            ]
            # Cascade lines held when the job dies are its best-known cause (a lone NCCL timeout, say).
            found = self.crash.flush(ts) or self._unclassified(ts)
            for finding in found:
                finding.evidence.extend(evidence)
            # "The job failed" says nothing of why: a symptom, never the root cause of a reported cascade.
            symptom = category == "job_failed"
            found = found or [
                Finding("crash", category, layer, ts, ts, confidence=0.6, evidence=evidence, cascade=symptom)
            ]
        elif state != "COMPLETED":
            # Cancelled, timed out, preempted: what was held is still this job's story.
            found = self.crash.flush(ts) or self._unclassified(ts)
        else:
            found = []
        return self._emit(found) + self.incidents.resolve(ts, f"{JOB_ENDED} ({state})")

    def _start(self, ts: float) -> list[Anomaly]:
        resolved = self.incidents.resolve(ts, JOB_RESTARTED)
        self.ended_at = None
        self._stopped_at = None
        self.liveness.forget()
        self.hang.restart(ts)
        self.straggler.restart()
        self.ranks.reset()
        self.crash.reset()
        self.activity.forget()
        self.incidents.reset()
        self._max_step, self._last_step_ts = -1, None
        return resolved

    # -- clock ------------------------------------------------------------------------
    def _activity(self, watermark: float) -> Verdict | None:
        """What the GPUs did since the last step — asked only once the job has been quiet a while."""
        last = self.hang.last_advance
        if last is None or self.hang.fired or watermark < last + self.hang.confirm_s:
            return None
        verdict = self.activity.verdict(since=last)
        if verdict.state == "culprit_idle" and self.nodes and verdict.suspects == [(self.nodes[0], 0)]:
            # Rank 0's GPU idle while its peers spin: a culprit, or rank 0 writing a checkpoint.
            return Verdict("writer_idle", verdict.samples, verdict.suspects, verdict.why)
        return verdict

    def advance(self, watermark: float) -> list[Anomaly]:
        found = self.crash.advance(watermark)
        activity = self._activity(watermark)
        silent = self._silent(watermark)
        hang = self.hang.advance(watermark, activity, bool(silent))
        if hang is not None and self.crash.fatal_pending:
            found += self._unclassified(watermark)  # the job stopped after lines no signature explains
        elif hang is not None:
            localise_hang(hang, self.gpus, activity, self.nodes, self.settings.gpu.missing_after_s)
            if silent:
                self._blame_silent(hang, silent, watermark)
            found.append(hang)
        if self.ended_at is None and watermark >= self._next_lost_check:
            self._next_lost_check = watermark + LOST_GPU_CHECK_S
            found += self.health.lost(self.gpus.missing(watermark, self.settings.gpu.missing_after_s), watermark)
        for plugin in list(self.plugins):
            found += self._run_plugin(plugin, plugin.advance, watermark)
        return self.stack_dumps.on_advance(self._emit(found), self.incidents, watermark, self.hang.last_advance)

    def _silent(self, watermark: float) -> list[tuple[int, str, float]]:
        """Ranks whose process fell silent while their peers beat — asked only of a job quiet a while."""
        last = self.hang.last_advance
        if last is None or self.hang.fired or watermark < last + self.hang.confirm_s:
            return []
        # A rank silent since long before the job's last step had left the job (an elastic scale-down): the job
        # stepped without it, so this stall is not its doing.
        joined = last - self.liveness.silent_after()
        return [(rank, node, ts) for rank, node, ts in self.liveness.silent(watermark) if ts >= joined]

    def _blame_silent(self, hang: Finding, silent: list[tuple[int, str, float]], watermark: float) -> None:
        """Name the ranks that stopped beating: the hang is theirs (stopped, frozen or gone)."""
        hang.ranks = [rank for rank, _, _ in silent]
        hang.nodes = sorted({node for _, node, _ in silent})
        hang.confidence = max(hang.confidence, 0.8)
        hang.localisation = "heartbeats"
        peers = len(self.liveness.ranks()) - len(silent)
        hang.evidence[1:1] = [
            f"rank {rank} on {node} has sent nothing for {watermark - ts:.0f}s while {peers} peer rank(s) still "
            "beat: its process is stopped, frozen or gone"
            for rank, node, ts in silent[:5]
        ]

    def end_of_input(self, watermark: float) -> list[Anomaly]:
        """The input ended (end of a replay, clean shutdown): release what waits on the clock.

        Held cascades are reported as the hold would have reported them (detected when the hold
        expires), and fatal-looking lines no signature explains as ``crash/unclassified``. No hang
        or straggler is declared, and nothing is resolved: the data stopping is not the job stopping.
        """
        found = self.crash.flush_expired()
        if self.ended_at is None:
            found += self._unclassified(watermark)
        return self.stack_dumps.on_advance(
            self._emit(found), self.incidents, watermark, self.hang.last_advance, final=True
        )

    def finished(self, watermark: float) -> bool:
        return self.ended_at is not None and watermark > self.ended_at + self.settings.linger_s

    def _unclassified(self, ts: float) -> list[Finding]:
        """``crash/unclassified`` findings, with the templates of their lines (new in this job or not)."""
        found = self.crash.unclassified(ts)
        for f in found:
            f.evidence += [hit.evidence() for hit in self._fatal_templates.values()]
        self._fatal_templates.clear()
        return found

    def _emit(self, findings: list[Finding]) -> list[Anomaly]:
        for f in findings:
            f.gpus = self.gpu_names.name(f.gpus)
        return self.incidents.emit(findings) if findings else []


NOTICE_QUIET_S = 600.0  # an idle node's notice of one kind is given once in this long


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
        self.down: Anomaly | None = None  # the open "node down" anomaly
        self._told: dict[tuple[str, tuple[str, ...]], float] = {}  # notice (category, GPUs) -> when last given
        self._gpu_names = GpuNames()

    def __setstate__(self, state: dict[str, object]) -> None:
        state.setdefault("down", None)
        state.setdefault("_told", {})
        state.setdefault("_gpu_names", GpuNames())  # (snapshots before 0.2 have none)
        self.__dict__.update(state)

    def observe(self, event: Event | GpuFrame) -> list[Anomaly]:
        self.last_ts = event.ts  # type: ignore[assignment]
        if type(event) is GpuFrame or isinstance(event, GpuSample):
            frame = as_frame(event)  # type: ignore[arg-type]
            if self.gpus.last_ts and frame.ts - self.gpus.last_ts > 2 * self.settings.gpu.missing_after_s:
                # The node was away (running a job): old sightings and counter readings are stale.
                self.gpus = GpuPeers(history=1)
                self.health.forget_samples()
            self.gpus.observe(frame)
            _learn_addresses(self.gpu_names, frame)
            return [self._anomaly(f, frame.job_id) for f in self.health.observe(frame)]
        if isinstance(event, LogRecord):
            return [self._anomaly(f, event.job_id) for f in self.crash.observe(event) if not self._told_lately(f)]
        if not isinstance(event, NodeEvent):
            return []
        # Slurm prints a base state and flags: "DOWN*", "IDLE+NOT_RESPONDING", "MIXED+FAIL".
        states = set(event.state.upper().rstrip("*").split("+"))
        if states & {"DOWN", "NOT_RESPONDING", "FAIL"}:
            if self.down is not None:
                return []  # still down: one anomaly per outage
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
            self.down = self._anomaly(f, event.job_id)
            return [self.down]
        if self.down is not None and not states & {"DRAIN", "DRAINED", "DRAINING", "MAINT", "REBOOT"}:
            down, self.down = self.down, None
            return [resolved(down, event.ts, NODE_RETURNED)]  # type: ignore[arg-type]
        return []

    def _told_lately(self, f: Finding) -> bool:
        """Whether ``f`` is a notice this node already gave within :data:`NOTICE_QUIET_S`.

        A status dump prints a line per GPU or port (dcgmi's link table, ibstat): one notice tells it.
        Within a job the incident groups them; an idle node has no incident, so it is done here.
        """
        if f.severity != "warning":
            return False
        key = (f.category, tuple(f.gpus))  # the same kind of notice about another GPU is news
        last = self._told.get(key)
        if last is not None and f.detected_at - last < NOTICE_QUIET_S:
            return True
        self._told[key] = f.detected_at
        return False

    def advance(self, watermark: float) -> list[Anomaly]:
        found = self.crash.advance(watermark)
        found += self.health.lost(self.gpus.missing(watermark, self.settings.gpu.missing_after_s), watermark)
        return [self._anomaly(f, None) for f in found]

    def end_of_input(self, watermark: float) -> list[Anomaly]:
        """The input ended: report held kernel-log cascades as their hold would have."""
        return [self._anomaly(f, None) for f in self.crash.flush_expired()]

    def finished(self, watermark: float) -> bool:
        return self.last_ts is not None and watermark > self.last_ts + self.idle_evict_s and self.down is None

    @property
    def gpu_names(self) -> GpuNames:
        return self._gpu_names

    def _anomaly(self, f: Finding, job_id: str | None) -> Anomaly:
        f.gpus = self.gpu_names.name(f.gpus)
        if job_id is None and f.kind in ("crash", "gpu_degraded"):
            # No job runs here: the node itself is the problem to act on.
            f.kind = "node_unhealthy"
        return to_anomaly(self.scope, job_id, f)


def _learn_addresses(names: GpuNames, frame: GpuFrame) -> None:
    """Learn the PCI address of each GPU of the frame that reports one."""
    if frame.pci_bus_id:
        for gpu, address in zip(frame.gpus, frame.pci_bus_id, strict=True):
            names.observe(frame.node, gpu, address)


def _fields(struct: object) -> dict[str, object]:
    return {name: getattr(struct, name) for name in struct.__struct_fields__}  # type: ignore[attr-defined]
