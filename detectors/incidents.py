"""From findings to anomalies: grouping one incident's many lines, and the anomaly lifecycle.

One fault makes hundreds of ranks print the same cascade; :class:`Incidents` turns
the findings of one scope (a job or an idle node) into anomalies:

- a crash or hang opens an *incident*; later crash/hang findings (and GPU counters
  moving meanwhile) within ``group_window_s`` are that incident's evidence, not news;
- stragglers, numerics and degradation are reported once per episode (cooldowns);
- every anomaly goes **open → resolved** (:meth:`Incidents.resolve`): progress
  resumed, the job ended or restarted, the node returned to service. A resolved
  incident groups nothing more, so a later fault of the same job is a new anomaly
  with its own id — one alarm never blinds the next;
- a hang alarm (or a cascade reported when its hold ran out) that a root cause then
  explains (an Xid, a CUDA error) does not swallow it: the root cause is reported and
  the earlier anomaly resolved as explained by it; so does a hardware fault that turns up
  under a crash blamed on software (a GPU that fell off the bus makes the job's CUDA calls
  fail first: the node must not stay in service behind an application error).

>>> from trainguard.detectors.findings import Finding
>>> inc = Incidents("job/7", "7", group_window_s=1200.0, straggler_cooldown_s=900.0)
>>> hang = inc.emit([Finding("hang", "no_progress", "unknown", 100.0, 160.0)])
>>> [a.category for a in hang]
['no_progress']
>>> [(a.resolution, a.resolved_at) for a in inc.resolve(200.0, "progress resumed after 100 s")]
[('progress resumed after 100 s', 200.0)]
>>> [a.category for a in inc.emit([Finding("crash", "xid_79", "hardware", 300.0, 300.0)])]  # not swallowed
['xid_79']
"""

from __future__ import annotations

import msgspec

from trainguard.detectors.attribution import attribute_layer
from trainguard.detectors.events import Anomaly
from trainguard.detectors.findings import Finding
from trainguard.detectors.ids import anomaly_id
from trainguard.detectors.lifecycle import SUPERSEDED

INCIDENT_KINDS = frozenset({"crash", "hang"})
SLOWDOWN_CATEGORIES = frozenset({"thermal_throttle", "power_brake", "hw_slowdown"})
MAX_OPEN = 256  # open anomalies remembered per scope (older ones stay open in the archive)


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
        localisation=f.localisation,
    )


def _hardware_under_software(f: Finding, incident: Anomaly) -> bool:
    """Whether ``f`` blames the hardware under an incident blamed on software (the hardware explains it)."""
    return incident.layer != "hardware" and attribute_layer(f.category, f.layer, f.transient)[0] == "hardware"


def resolved(anomaly: Anomaly, now: float, resolution: str) -> Anomaly:
    """The resolution record of ``anomaly``: the same anomaly, published again, resolved."""
    return msgspec.structs.replace(anomaly, resolved_at=max(now, anomaly.detected_at), resolution=resolution)


class Incidents:
    """Grouping and lifecycle of one scope's anomalies."""

    def __init__(self, scope: str, job_id: str | None, group_window_s: float, straggler_cooldown_s: float) -> None:
        self.scope = scope
        self.job_id = job_id
        self.group_window_s = group_window_s
        self.straggler_cooldown_s = straggler_cooldown_s
        self.incident: Anomaly | None = None  # the open crash/hang incident
        self._symptom = False  # the incident was opened by a cascade (a symptom), its root still unknown
        self._last_ts = float("-inf")  # newest finding grouped into it
        self._quiet_until: dict[str, float] = {}  # topic -> end of its dedupe window
        self.open: dict[str, Anomaly] = {}

    # -- findings ---------------------------------------------------------------------
    def emit(self, findings: list[Finding]) -> list[Anomaly]:
        out: list[Anomaly] = []
        for f in findings:
            out += self._one(f)
        return out

    def _one(self, f: Finding) -> list[Anomaly]:
        inc = self.incident
        grouped = (
            (f.kind in INCIDENT_KINDS or f.kind == "gpu_degraded")
            and inc is not None
            and f.onset_ts <= self._last_ts + self.group_window_s
        )
        if grouped and inc is not None:
            if (
                (inc.kind == "hang" or self._symptom or _hardware_under_software(f, inc))
                and f.kind == "crash"
                and not f.cascade
                and f.severity == "critical"
            ):
                # The root cause of a hang alarm (or of a cascade reported without one) turned up, or the
                # hardware fault under a software error did (the kernel's Xid 79 a moment after the job's
                # "CUDA error: unspecified launch failure"): report it, and close the earlier anomaly as
                # explained by it, so the node is not left in service behind an application error.
                anomaly = self._open(f)
                self.incident, self._last_ts, self._symptom = anomaly, f.detected_at, False
                return [*self._close(inc, f.detected_at, f"{SUPERSEDED} {anomaly.anomaly_id}"), anomaly]
            self._last_ts = max(self._last_ts, f.detected_at)
            return []
        if f.kind not in INCIDENT_KINDS and not self._fresh(f):
            return []
        anomaly = self._open(f)
        if f.kind in INCIDENT_KINDS:
            self.incident, self._last_ts, self._symptom = anomaly, f.detected_at, f.cascade
        return [anomaly]

    def _fresh(self, f: Finding) -> bool:
        """One straggler / numerics / degradation report per episode, not per step."""
        # A GPU throttling under a reported straggler is that straggler's cause.
        if f.category in SLOWDOWN_CATEGORIES and f.detected_at < self._quiet_until.get("straggler", -1.0):
            return False
        topic = f.kind if f.kind == "straggler" else f"{f.kind}/{f.category}/{','.join(f.gpus)}"
        if f.detected_at < self._quiet_until.get(topic, float("-inf")):
            if f.kind == "numerics":  # NaNs on every step are one episode for as long as they last
                self._quiet_until[topic] = f.detected_at + self.group_window_s
            return False
        window = self.straggler_cooldown_s if f.kind == "straggler" else self.group_window_s
        self._quiet_until[topic] = f.detected_at + window
        return True

    def _open(self, f: Finding) -> Anomaly:
        anomaly = to_anomaly(self.scope, self.job_id, f)
        if len(self.open) >= MAX_OPEN:
            self.open.pop(next(iter(self.open)))
        self.open[anomaly.anomaly_id] = anomaly
        return anomaly

    # -- lifecycle ----------------------------------------------------------------------
    def _close(self, anomaly: Anomaly, now: float, resolution: str) -> list[Anomaly]:
        self.open.pop(anomaly.anomaly_id, None)
        return [resolved(anomaly, now, resolution)]

    def resolve(
        self, now: float, resolution: str, kinds: frozenset[str] | None = None, opened_before: float | None = None
    ) -> list[Anomaly]:
        """Resolve the open anomalies (of ``kinds``, detected before ``opened_before``, or all):
        their resolution records, oldest first."""
        out: list[Anomaly] = []
        for anomaly in list(self.open.values()):
            if (kinds is None or anomaly.kind in kinds) and (
                opened_before is None or anomaly.detected_at < opened_before
            ):
                out += self._close(anomaly, now, resolution)
        if self.incident is not None and self.incident.anomaly_id not in self.open:
            self.incident = None  # closed: a later fault is a new incident
        return out

    def revise(self, anomaly: Anomaly) -> None:
        """Keep ``anomaly`` — an open one published again, better localised — as its id's record,
        so its resolution (and grouping) carry what the revision learnt."""
        if anomaly.anomaly_id in self.open:
            self.open[anomaly.anomaly_id] = anomaly
            if self.incident is not None and self.incident.anomaly_id == anomaly.anomaly_id:
                self.incident = anomaly

    def __setstate__(self, state: dict[str, object]) -> None:
        state.setdefault("_symptom", False)
        self.__dict__.update(state)

    def reset(self) -> None:
        """Forget grouping windows (the job restarted); open anomalies stay until resolved."""
        self.incident = None
        self._symptom = False
        self._last_ts = float("-inf")
        self._quiet_until.clear()
