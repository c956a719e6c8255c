"""Slurm watcher: polls ``squeue --json`` and ``sinfo --json`` and emits scheduler records on change.

Job records carry the node list expanded from Slurm's hostlist syntax; node records
carry the base state and its flags as Slurm prints them (``IDLE+DRAIN``,
``DOWN+NOT_RESPONDING``) with the reason. The first poll reports every job and
node (the state a fresh flow needs); later polls only what changed.

>>> from trainguard.actions.commands import Completed
>>> class Tools:
...     def __init__(self): self.docs = {"sinfo": {"nodes": []}, "squeue": {"jobs": []}}
...     def run(self, argv): return Completed(__import__("json").dumps(self.docs[argv[0]]), ())
>>> tools = Tools(); watcher = SlurmWatcher(tools)
>>> tools.docs["squeue"]["jobs"] = [{"job_id": 7, "job_state": "RUNNING", "nodes": "gpu-node-[01-02]"}]
>>> [(t, r["state"], r["nodes"]) for t, r in watcher.poll(now=100.0)]
[('scheduler', 'RUNNING', ['gpu-node-01', 'gpu-node-02'])]
>>> watcher.poll(now=105.0)
[]
"""

from __future__ import annotations

import json
import time
from typing import Any, Protocol

from trainguard.actions.commands import CommandFailed
from trainguard.actions.hostlist import HostlistError, expand
from trainguard.agents.loop import Agent, SourceUnavailable
from trainguard.agents.scheduler_changes import StateChanges
from trainguard.detectors import job_states

_NODE_FLAGS_SHOWN = ("DRAIN", "DRAINING", "DRAINED", "NOT_RESPONDING", "FAIL", "MAINTENANCE", "REBOOT_REQUESTED")


class _Runner(Protocol):
    def run(self, argv: list[str]) -> Any: ...


class SlurmWatcher(Agent):
    """Turns successive Slurm snapshots into job and node state-change records."""

    name = "watch-slurm"

    def __init__(self, runner: _Runner) -> None:
        self.runner = runner
        self.changes = StateChanges()

    def poll(self, now: float | None = None) -> list[tuple[str, dict[str, Any]]]:
        """One round: the records for every job and node whose state changed since the last round."""
        ts = time.time() if now is None else now
        try:
            jobs = json.loads(self.runner.run(["squeue", "--json", "--states=all"]).stdout).get("jobs", [])
            nodes = json.loads(self.runner.run(["sinfo", "--json"]).stdout).get("nodes", [])
        except CommandFailed as exc:
            why = " ".join(str(exc).split())[:200]
            raise SourceUnavailable(
                f"cannot reach Slurm ({why}); check that squeue and sinfo work here "
                "(or set scheduler.ssh_host / scheduler.bin_dir)."
            ) from None
        return self._job_changes(jobs, ts) + self._node_changes(nodes, ts)

    def _job_changes(self, jobs: list[dict[str, Any]], ts: float) -> list[tuple[str, dict[str, Any]]]:
        out = []
        for j in jobs:
            state = str(j.get("job_state", "UNKNOWN")).upper()
            try:
                nodes = tuple(expand(j.get("nodes") or ""))
            except HostlistError:
                nodes = ()
            record = self.changes.job(ts, str(j.get("job_id")), state, nodes)
            if record is None:
                continue
            if record["nodes"] and j.get("tasks"):
                record["ranks_per_node"] = max(1, int(j["tasks"]) // len(record["nodes"]))
            exit_code = _exit_code(j)
            if exit_code is not None and job_states.has_ended(state):
                record["exit_code"] = exit_code
            out.append(("scheduler", record))
        return out

    def _node_changes(self, nodes: list[dict[str, Any]], ts: float) -> list[tuple[str, dict[str, Any]]]:
        out = []
        for n in nodes:
            flags = [str(f).upper() for f in n.get("state_flags") or [] if str(f).upper() in _NODE_FLAGS_SHOWN]
            state = "+".join([str(n.get("state", "unknown")).upper(), *flags])
            record = self.changes.node(ts, n["name"], state, n.get("reason") or "")
            if record is not None:
                out.append(("scheduler", record))
        return out


def _exit_code(job: dict[str, Any]) -> int | None:
    code = job.get("exit_code")
    if isinstance(code, dict):  # newer Slurm: {"status": ..., "return_code": N}
        code = code.get("return_code")
    return int(code) if isinstance(code, int) else None
