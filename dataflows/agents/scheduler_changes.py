"""What changed between two looks at a scheduler: the bookkeeping every scheduler watcher shares.

A watcher reads the jobs and nodes its scheduler reports and asks :class:`StateChanges` for the
``scheduler`` records of what changed since its last look (the first look reports everything:
the state a fresh flow needs). A finished job no longer lists its nodes; its record keeps the
nodes it ran on.

>>> changes = StateChanges()
>>> changes.job(100.0, "7", "RUNNING", ("n1", "n2"))["nodes"]
['n1', 'n2']
>>> changes.job(105.0, "7", "RUNNING", ("n1", "n2")) is None
True
>>> changes.job(110.0, "7", "COMPLETED", ())["nodes"]
['n1', 'n2']
>>> changes.node(110.0, "n1", "IDLE+DRAIN", "trainguard: xid_79")["reason"]
'trainguard: xid_79'
"""

from __future__ import annotations

from typing import Any


class StateChanges:
    """The last state reported for each job and node."""

    def __init__(self) -> None:
        self.jobs: dict[str, tuple[str, tuple[str, ...]]] = {}
        self.nodes: dict[str, tuple[str, str]] = {}

    def job(self, ts: float, job_id: str, state: str, nodes: tuple[str, ...]) -> dict[str, Any] | None:
        """The job record if ``job_id`` is new or its state or nodes changed, else ``None``."""
        before = self.jobs.get(job_id)
        if before is not None and before[0] == state and (not nodes or before[1] == nodes):
            return None
        known = nodes or (before[1] if before is not None else ())
        self.jobs[job_id] = (state, known)
        return {"ts": ts, "kind": "job", "job_id": job_id, "state": state, "nodes": list(known)}

    def node(self, ts: float, node: str, state: str, reason: str) -> dict[str, Any] | None:
        """The node record if ``node`` is new or its state or reason changed, else ``None``."""
        if self.nodes.get(node) == (state, reason):
            return None
        self.nodes[node] = (state, reason)
        record: dict[str, Any] = {"ts": ts, "kind": "node", "node": node, "state": state}
        if reason:
            record["reason"] = reason
        return record
