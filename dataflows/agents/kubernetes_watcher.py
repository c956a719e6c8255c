"""Kubernetes watcher: batch Jobs, where their pods run, and node state, as ``scheduler`` records.

What ``watch-slurm`` does for Slurm: each poll reads the Kubernetes driver's inventory (the
same three list calls its actions use — nodes, the namespace's Jobs and pods) and publishes
what changed. A Job's nodes are those its pods are scheduled on; its state is Slurm's word
for it (``RUNNING``, ``PENDING``, ``SUSPENDED``, ``COMPLETED``, ``FAILED``, and ``CANCELLED``
when a Job that had not ended disappears). A node is ``READY`` or ``DOWN`` (its Ready
condition), with ``+DRAIN`` when it is cordoned or carries trainguard's quarantine taint.

>>> from types import SimpleNamespace as NS
>>> from trainguard.actions.drivers import Inventory, JobInfo, NodeInfo
>>> class Driver:
...     def __init__(self): self.inv = Inventory(nodes={}, jobs={})
...     def inventory(self): return self.inv
>>> driver = Driver(); watcher = KubernetesWatcher(driver)
>>> driver.inv = Inventory(nodes={"n1": NodeInfo("n1", "ready", ("gpu",), False, "")},
...                        jobs={"train-1": JobInfo("train-1", "train-1", "RUNNING", "gpu", ("n1",))})
>>> [(r["kind"], r["state"]) for _, r in watcher.poll(now=100.0)]
[('job', 'RUNNING'), ('node', 'READY')]
>>> driver.inv = Inventory(nodes=driver.inv.nodes, jobs={})
>>> [(r["job_id"], r["state"], r["nodes"]) for _, r in watcher.poll(now=105.0)]
[('train-1', 'CANCELLED', ['n1'])]
"""

from __future__ import annotations

import time
from typing import Protocol

from trainguard.actions.commands import CommandFailed
from trainguard.actions.drivers import Inventory
from trainguard.agents.loop import Agent, Publish, SourceUnavailable
from trainguard.agents.scheduler_changes import StateChanges
from trainguard.detectors import job_states


class _Inventories(Protocol):
    def inventory(self) -> Inventory: ...


class KubernetesWatcher(Agent):
    """Turns successive Kubernetes inventories into job and node state-change records."""

    name = "watch-kubernetes"

    def __init__(self, driver: _Inventories) -> None:
        self.driver = driver
        self.changes = StateChanges()

    def poll(self, now: float | None = None) -> list[Publish]:
        ts = time.time() if now is None else now
        try:
            inventory = self.driver.inventory()
        except CommandFailed as exc:
            why = " ".join(str(exc).split())[:200]
            raise SourceUnavailable(
                f"cannot read the Kubernetes API ({why}); check the kubeconfig or the service account's RBAC."
            ) from None
        out: list[Publish] = []
        for job in sorted(inventory.jobs.values(), key=lambda j: j.job_id):
            record = self.changes.job(ts, job.job_id, job.state, job.nodes)
            if record is not None:
                out.append(("scheduler", record))
        for job_id, (state, _) in sorted(self.changes.jobs.items()):
            if job_id not in inventory.jobs and not job_states.has_ended(state):
                record = self.changes.job(ts, job_id, "CANCELLED", ())  # deleted before it ended
                if record is not None:
                    out.append(("scheduler", record))
        for node in sorted(inventory.nodes.values(), key=lambda n: n.name):
            state = ("READY" if node.state == "ready" else "DOWN") + ("+DRAIN" if node.drained else "")
            record = self.changes.node(ts, node.name, state, node.reason)
            if record is not None:
                out.append(("scheduler", record))
        return out
