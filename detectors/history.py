"""Attribution from history: what one anomaly cannot tell, the last day of anomalies can.

One instance sees every anomaly of the cluster (they are rare, so one is enough)
and revises the layer and transient verdict of each new one from sliding-window
counts per node and per GPU:

- a node that turns up in the failures of ``lemon_jobs`` different jobs is a
  *lemon*: its next failure is hardware, whatever the log line looked like;
- the same fatal Xid (or ECC/row-remap trouble) on the same GPU again is
  persistent hardware;
- an application error that comes back in the same job after a restart is a
  persistent application fault (holding the job beats requeueing it forever);
- a transient hardware fault (one InfiniBand completion error, a link flap that
  recovered) that comes back on the same node within ``repeat_window_s`` is a
  part going bad: persistent, so the node is drained the second time.

>>> from trainguard.detectors.events import Anomaly
>>> hist = HistoryAttributor(lemon_jobs=2)
>>> def crash(job, ts):
...     return Anomaly(anomaly_id=f"a{job}", detected_at=ts, kind="crash", category="cuda_launch_failure",
...                    layer="application", transient=False, job_id=job, nodes=["n7"])
>>> hist.revise(crash("1", 100.0)).layer
'application'
>>> second = hist.revise(crash("2", 900.0))
>>> second.layer, second.evidence[-1]
('hardware', 'node n7 failed 2 different jobs within 24h: a lemon node')
"""

from __future__ import annotations

from collections import deque

import msgspec

from trainguard.detectors.events import Anomaly

FAILURE_KINDS = frozenset({"crash", "hang"})
GPU_FAULT_PREFIXES = ("xid_", "ecc_", "row_remap", "gpu_lost")


class HistorySettings(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    window_s: float = 86_400.0
    lemon_jobs: int = 3  # distinct jobs a node must have failed to be called a lemon
    repeat_on_gpu: int = 2  # the same GPU fault this many times is persistent hardware
    repeat_window_s: float = 3600.0  # a transient hardware fault again on the same node within this: persistent


class HistoryAttributor:
    """Sliding-window failure history per node, per GPU and per job."""

    def __init__(
        self, lemon_jobs: int = 3, repeat_on_gpu: int = 2, window_s: float = 86_400.0, repeat_window_s: float = 3600.0
    ) -> None:
        self.lemon_jobs = lemon_jobs
        self.repeat_on_gpu = repeat_on_gpu
        self.window_s = window_s
        self.repeat_window_s = repeat_window_s
        self._node_transients: dict[tuple[str, str], deque[float]] = {}
        self._revised: dict[str, tuple[str, bool | None, list[str]]] = {}  # anomaly id -> its revision
        self._node_failures: dict[str, deque[tuple[float, str]]] = {}
        self._gpu_faults: dict[tuple[str, str], deque[tuple[float, str]]] = {}
        self._job_errors: dict[tuple[str, str], int] = {}

    def __setstate__(self, state: dict[str, object]) -> None:
        state.setdefault("repeat_window_s", 3600.0)
        state.setdefault("_node_transients", {})
        state.setdefault("_revised", {})
        self.__dict__.update(state)

    def revise(self, anomaly: Anomaly) -> Anomaly:
        """The anomaly with its layer/transient verdict revised by history (and history updated).

        A resolution (the same anomaly published again) gets the revision its opening record got.
        """
        if anomaly.resolved_at is not None:
            revision = self._revised.pop(anomaly.anomaly_id, None)
            if revision is None:
                return anomaly
            layer, transient, evidence = revision
            return msgspec.structs.replace(anomaly, layer=layer, transient=transient, evidence=evidence)
        now = anomaly.detected_at
        evidence: list[str] = []
        layer, transient = anomaly.layer, anomaly.transient
        # A notice (what a status dump showed, a handled warning) is no failure of the node's jobs.
        if anomaly.kind in FAILURE_KINDS and anomaly.job_id is not None and anomaly.severity == "critical":
            for node in anomaly.nodes:
                failures = self._trim(self._node_failures.setdefault(node, deque()), now)
                failures.append((now, anomaly.job_id))
                jobs = {job for _, job in failures}
                if len(jobs) >= self.lemon_jobs and layer != "hardware":
                    layer, transient = "hardware", False
                    evidence.append(
                        f"node {node} failed {len(jobs)} different jobs within {self.window_s / 3600:g}h: a lemon node"
                    )
        if anomaly.category.startswith(GPU_FAULT_PREFIXES):
            for gpu in anomaly.gpus:
                seen = self._trim(self._gpu_faults.setdefault((gpu, anomaly.category), deque()), now)
                seen.append((now, anomaly.anomaly_id))
                if len(seen) >= self.repeat_on_gpu and layer == "hardware" and transient is not False:
                    transient = False
                    evidence.append(
                        f"{anomaly.category} on {gpu} {len(seen)} times within {self.window_s / 3600:g}h: persistent"
                    )
        if layer == "hardware" and transient is True and anomaly.severity == "critical":
            for node in anomaly.nodes:
                key = (node, anomaly.category)
                seen = self._node_transients.setdefault(key, deque())
                while seen and seen[0] < now - self.repeat_window_s:
                    seen.popleft()
                seen.append(now)
                if len(seen) >= 2:
                    transient = False
                    evidence.append(
                        f"{anomaly.category} on {node} {len(seen)} times within {self.repeat_window_s / 60:g} min: "
                        "persistent"
                    )
        if anomaly.layer == "application" and anomaly.job_id is not None and layer == "application":
            key = (anomaly.job_id, anomaly.category)
            self._job_errors[key] = self._job_errors.get(key, 0) + 1
            if self._job_errors[key] >= 2 and transient is not False:
                transient = False
                evidence.append(f"{anomaly.category} again in job {anomaly.job_id} after a restart: persistent")
        if not evidence:
            return anomaly
        revised = msgspec.structs.replace(
            anomaly, layer=layer, transient=transient, evidence=[*anomaly.evidence, *evidence][-12:]
        )
        if len(self._revised) > 10_000:  # resolutions of very old anomalies lose their revision, nothing else
            self._revised.pop(next(iter(self._revised)))
        self._revised[anomaly.anomaly_id] = (revised.layer, revised.transient, revised.evidence)
        return revised

    def _trim(self, events: deque[tuple[float, str]], now: float) -> deque[tuple[float, str]]:
        while events and events[0][0] < now - self.window_s:
            events.popleft()
        return events
