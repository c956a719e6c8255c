"""Pure checks the executor makes before and after acting: scope, names, no-ops, effects.

No I/O here: each takes the policy and the scheduler's inventory as it stands.

>>> from trainguard.actions.drivers import Inventory, NodeInfo
>>> from trainguard.actions.records import Action
>>> inv = Inventory(nodes={"n1": NodeInfo("n1", "idle", ("gpu",), drained=True)})
>>> drain = Action(action_id="ac-1", anomaly_id="an-1", decided_at=0.0, action="drain_node", target="n1")
>>> already_done(drain, inv)
'node n1 is already drained (no reason)'
>>> invalid_target(Action(action_id="ac-2", anomaly_id="an-1", decided_at=0.0, action="drain_node",
...                       target="n1; reboot"), inv)
"unknown node 'n1; reboot': not in the scheduler's inventory"
"""

from __future__ import annotations

import fnmatch
from typing import Any

from trainguard.actions.drivers import SAFE_JOB, SAFE_NODE, Inventory
from trainguard.actions.policy import Mode, PolicyConfig
from trainguard.actions.records import Action
from trainguard.detectors import job_states
from trainguard.detectors.events import Anomaly

NODE_ACTIONS = ("drain_node", "resume_node")
JOB_ACTIONS = ("requeue_job", "hold_job", "release_job", "cancel_job")
FINISHED_JOB_STATES = job_states.FINISHED


def partitions_of(inventory: Inventory, nodes: list[str], job_id: str | None) -> set[str]:
    """The partitions of these nodes and of the job, as the scheduler's inventory knows them."""
    partitions = {p for n in nodes if n in inventory.nodes for p in inventory.nodes[n].partitions}
    job = inventory.jobs.get(job_id or "")
    if job is not None:
        partitions.add(job.partition)
    return partitions


def mode_for(config: PolicyConfig, action: Action, anomaly: Anomaly, inventory: Inventory | None) -> Mode:
    """The mode of the first scope that covers this action's node or job (else the cluster's)."""
    partitions: set[str] = set()
    names = {anomaly.job_id} if anomaly.job_id else set()
    if inventory is not None:
        nodes = [action.target] if action.action in NODE_ACTIONS else []
        partitions = partitions_of(inventory, nodes, anomaly.job_id)
        job = inventory.jobs.get(anomaly.job_id or "")
        if job is not None:
            names.add(job.name)
    for scope in config.scopes:
        if scope.partition is not None and scope.partition not in partitions:
            continue
        if scope.job is not None and not any(fnmatch.fnmatchcase(n, scope.job) for n in names):
            continue
        return scope.mode
    return config.mode


def invalid_target(action: Action, inventory: Inventory) -> str | None:
    """Why this action's names may not reach a command (``None``: they may)."""
    strict = inventory.complete
    if action.action in NODE_ACTIONS:
        if not SAFE_NODE.match(action.target) or (strict and action.target not in inventory.nodes):
            return f"unknown node {action.target!r}: not in the scheduler's inventory"
    elif action.action in JOB_ACTIONS:
        if not SAFE_JOB.match(action.target) or (strict and action.target not in inventory.jobs):
            return f"unknown job {action.target!r}: not in the scheduler's inventory"
        for node in (n for n in action.params.get("exclude", "").split(",") if n):
            if not SAFE_NODE.match(node) or (strict and node not in inventory.nodes):
                return f"unknown node {node!r} in the exclude list: not in the scheduler's inventory"
    else:
        return f"unknown action {action.action!r}"
    return None


def already_done(action: Action, inventory: Inventory) -> str | None:
    """Why carrying this action out would change nothing (``None``: it would)."""
    node = inventory.nodes.get(action.target)
    job = inventory.jobs.get(action.target)
    if action.action == "drain_node" and node is not None and node.drained:
        return f"node {action.target} is already drained ({node.reason or 'no reason'})"
    if action.action == "resume_node" and node is not None and not node.drained:
        return f"node {action.target} is not drained"
    if action.action == "hold_job" and job is not None and job.held:
        return f"job {action.target} is already held"
    if action.action == "cancel_job" and job is not None and job.state in FINISHED_JOB_STATES:
        return f"job {action.target} has already ended ({job.state})"
    return None


def shows_effect(action: Action, intent: dict[str, Any], inventory: Inventory) -> bool:
    """Whether the scheduler shows that an intent's command took effect (for reconciliation)."""
    node = inventory.nodes.get(action.target)
    job = inventory.jobs.get(action.target)
    match action.action:
        case "drain_node":
            return node is not None and node.drained
        case "resume_node":
            return node is not None and not node.drained
        case "requeue_job":
            before = intent.get("restarts_before")
            return job is not None and job.restarts > (int(before) if before is not None else -1)
        case "hold_job":
            return job is not None and job.held
        case "cancel_job":
            return job is None or job.state in FINISHED_JOB_STATES
    return False
