"""A job's stack dumps, and the moment they name the culprit of its open hang.

``collect-stacks`` answers a ``diagnose`` action with one stacks record per process of
the job, from every node, within a few seconds of each other. :class:`HangStacks` keeps
the newest dump of each process and, once they have settled (no new dump for
``settle_s`` of event time), hands the open hang anomaly back revised: ``ranks``/``nodes``
set to the outliers :func:`detectors.stacks.localise` names, evidence lines naming the
groups, ``stack_groups`` and ``localisation="stacks"`` — published again under the same
``anomaly_id`` (``revised_at`` set). Dumps that arrive just before the hang fires are
attached to the anomaly as it opens. Only dumps taken after the job's last progress
count: before it, the ranks were not stuck.

>>> from trainguard.detectors.events import Anomaly, StacksRecord, StackFrame, ThreadStack
>>> from trainguard.detectors.incidents import Incidents
>>> from trainguard.detectors.findings import Finding
>>> inc = Incidents("job/7", "7", group_window_s=1200.0, straggler_cooldown_s=900.0)
>>> [hang] = inc.emit([Finding("hang", "no_progress", "unknown", 100.0, 160.0, evidence=["no step for 60 s"])])
>>> def dump(rank, fn, ts=170.0):
...     frames = [StackFrame(name=fn, filename="train.py"), StackFrame(name="main", filename="train.py")]
...     return StacksRecord(ts=ts, job_id="7", node=f"n{rank // 2}", rank=rank, pid=100 + rank,
...                         threads=[ThreadStack(name="MainThread", frames=frames)])
>>> view = HangStacks()
>>> for rank in range(4):
...     view.observe(dump(rank, "load_batch" if rank == 2 else "all_reduce"))
>>> view.on_advance([], inc, watermark=172.0, stalled_since=100.0)  # still settling
[]
>>> [revised] = view.on_advance([], inc, watermark=175.0, stalled_since=100.0)
>>> revised.anomaly_id == hang.anomaly_id, revised.ranks, revised.nodes, revised.localisation, revised.revised_at
(True, [2], ['n1'], 'stacks', 175.0)
>>> revised.evidence[1]
'stacks: 3 ranks (0, 1, 3) in all_reduce ← main'
>>> view.on_advance([], inc, watermark=180.0, stalled_since=100.0)  # nothing new since
[]
"""

from __future__ import annotations

import math

import msgspec

from trainguard.detectors.events import Anomaly, StacksRecord
from trainguard.detectors.incidents import Incidents
from trainguard.detectors.stacks import localise

__all__ = ["HangStacks"]

SETTLE_S = 5.0  # the dumps of one diagnose come within a few seconds: wait this long after the newest
ROUND_S = 120.0  # dumps older than the newest by more than this belong to an earlier round
MAX_PROCESSES = 8192  # newest dump per process, bounded
STACK_EVIDENCE = "stacks: "


class HangStacks:
    """The newest dump per process of one job, and when it revises the job's open hang."""

    def __init__(self, settle_s: float = SETTLE_S, round_s: float = ROUND_S) -> None:
        self.settle_s = settle_s
        self.round_s = round_s
        self._dumps: dict[tuple[str, int | str], StacksRecord] = {}
        self._newest = -math.inf
        self._reported = -math.inf  # the newest dump a published anomaly already reflects

    def observe(self, record: StacksRecord) -> None:
        """Keep ``record`` as its process's newest dump."""
        ts: float = record.ts  # type: ignore[assignment]
        key = (record.node, record.rank if record.rank is not None else f"pid{record.pid}")
        old = self._dumps.get(key)
        if old is not None and old.ts > ts:  # type: ignore[operator]
            return
        if old is None and len(self._dumps) >= MAX_PROCESSES:
            self._dumps.pop(next(iter(self._dumps)))
        self._dumps[key] = record
        self._newest = max(self._newest, ts)

    def current(self, stalled_since: float | None) -> list[StacksRecord]:
        """The latest round of dumps taken after the job's last progress."""
        floor = self._newest - self.round_s
        if stalled_since is not None:
            floor = max(floor, stalled_since)
        return [r for r in self._dumps.values() if r.ts >= floor]  # type: ignore[operator]

    def on_advance(
        self,
        out: list[Anomaly],
        incidents: Incidents,
        watermark: float,
        stalled_since: float | None,
        final: bool = False,
    ) -> list[Anomaly]:
        """``out`` (what the job's monitor emits now), with its open hang revised when new dumps settled.

        A hang opened in ``out`` itself is replaced by the revised record (it opens localised);
        otherwise the revision is appended. ``final``: the input ended, nothing more will come.
        """
        incident = incidents.incident
        if (
            incident is None
            or incident.kind != "hang"
            or incident.anomaly_id not in incidents.open
            or self._newest <= self._reported
            or (watermark < self._newest + self.settle_s and not final)
        ):
            return out
        records = self.current(stalled_since)
        if not records:
            return out
        self._reported = self._newest
        opened_now = any(a.anomaly_id == incident.anomaly_id and a.resolved_at is None for a in out)
        revised = _revise(incident, records, None if opened_now else watermark)
        incidents.revise(revised)
        if opened_now:
            return [revised if a.anomaly_id == incident.anomaly_id and a.resolved_at is None else a for a in out]
        return [*out, revised]


def _revise(anomaly: Anomaly, records: list[StacksRecord], revised_at: float | None) -> Anomaly:
    verdict = localise(records)
    kept = [line for line in anomaly.evidence if not line.startswith(STACK_EVIDENCE)]
    evidence = [*kept[:1], *verdict.evidence(), *kept[1:]][:14]
    changes: dict[str, object] = {"evidence": evidence, "stack_groups": verdict.groups}
    if verdict.outliers:
        changes |= {
            "ranks": verdict.outlier_ranks,
            "nodes": verdict.outlier_nodes,
            "localisation": "stacks",
            "confidence": max(anomaly.confidence, 0.8),
        }
    if revised_at is not None:
        changes["revised_at"] = revised_at
    return msgspec.structs.replace(anomaly, **changes)  # type: ignore[arg-type]
