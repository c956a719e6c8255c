"""Job states as trainguard reads them: one definition for the router, the monitors, the Slurm
watcher and the action checks (they used to keep their own lists, and disagreed).

Slurm's states (``squeue`` long names); the Kubernetes driver maps its jobs onto them.

>>> [phase(s) for s in ("RUNNING", "REQUEUE_HOLD", "PENDING", "NODE_FAIL", "COMPLETED", "whatever")]
['running', 'waiting', 'waiting', 'ended', 'ended', 'ended']
"""

from __future__ import annotations

from typing import Literal

__all__ = ["FAILED", "FINISHED", "RUNNING", "WAITING", "has_ended", "phase"]

RUNNING = frozenset({"RUNNING", "CONFIGURING", "COMPLETING"})
# Not running now, but not over: it will (or may) run again.
WAITING = frozenset({"PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "SUSPENDED", "RESIZING", "STOPPED"})
# Ended by a fault: the category and layer the scheduler's word alone supports.
FAILED: dict[str, tuple[str, str]] = {
    "FAILED": ("job_failed", "unknown"),
    "NODE_FAIL": ("node_fail", "hardware"),
    "OUT_OF_MEMORY": ("host_oom", "system"),
    "BOOT_FAIL": ("node_fail", "hardware"),
}
FINISHED = frozenset({"CANCELLED", "COMPLETED", "TIMEOUT", "PREEMPTED", "DEADLINE", "REVOKED", "SPECIAL_EXIT", *FAILED})


def phase(state: str) -> Literal["running", "waiting", "ended"]:
    """Where a job in ``state`` is; a state we do not know counts as ended (it is not running)."""
    state = state.upper()
    if state in RUNNING:
        return "running"
    return "waiting" if state in WAITING else "ended"


def has_ended(state: str) -> bool:
    return phase(state) == "ended"
