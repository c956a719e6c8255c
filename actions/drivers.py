"""The scheduler driver protocol, the inventory it reports, and the dry-run driver.

A driver turns one decided action into scheduler commands. Every method returns
the attempts it made (for the audit log) or raises
:class:`~actions.commands.CommandFailed`. Names are checked by the executor
against :meth:`SchedulerDriver.inventory` before a driver ever sees them.

>>> inv = Inventory(nodes={"n1": NodeInfo("n1", "idle", ("gpu",))}, jobs={})
>>> driver = DryRunDriver(inv)
>>> driver.drain_node("n1", "trainguard: crash/xid_79")
()
>>> driver.commands
[('drain_node', 'n1', 'trainguard: crash/xid_79')]
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Literal, Protocol, runtime_checkable

import msgspec

from trainguard.actions.commands import Attempt, CommandRunner

# What a scheduler accepts as a node name or job id; anything else never reaches a command.
SAFE_NODE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
SAFE_JOB = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]+")


def clean_reason(text: str, limit: int = 200) -> str:
    """A reason safe to hand a scheduler: one line, no control characters, bounded.

    >>> clean_reason("xid 79\\nrm -rf /\\x1b[2J")
    'xid 79 rm -rf / [2J'
    """
    return _CONTROL.sub(" ", text).strip()[:limit]


@dataclass(frozen=True)
class NodeInfo:
    name: str
    state: str  # the scheduler's base state, lower case: idle, mixed, allocated, down, ...
    partitions: tuple[str, ...] = ()
    drained: bool = False
    reason: str = ""

    @property
    def unavailable(self) -> bool:
        return self.drained or self.state in ("down", "drained", "draining", "fail", "failing")


@dataclass(frozen=True)
class JobInfo:
    job_id: str
    name: str
    state: str  # upper case, the scheduler's: RUNNING, PENDING, ...
    partition: str = ""
    nodes: tuple[str, ...] = ()
    restarts: int = 0
    held: bool = False


@dataclass(frozen=True)
class Inventory:
    """What the scheduler says exists: the only names actions may target."""

    nodes: dict[str, NodeInfo] = field(default_factory=dict)
    jobs: dict[str, JobInfo] = field(default_factory=dict)
    # False only for a dry run given no inventory: names are then checked by pattern alone.
    complete: bool = True

    def partition_nodes(self, partition: str) -> list[NodeInfo]:
        return [n for n in self.nodes.values() if partition in n.partitions]


@runtime_checkable
class SchedulerDriver(Protocol):
    """Scheduler operations trainguard may perform; each returns the attempts it made."""

    name: str

    def inventory(self) -> Inventory: ...

    def drain_node(self, node: str, reason: str) -> tuple[Attempt, ...]: ...

    def resume_node(self, node: str) -> tuple[Attempt, ...]: ...

    def requeue_job(self, job_id: str, exclude: list[str]) -> tuple[Attempt, ...]: ...

    def hold_job(self, job_id: str) -> tuple[Attempt, ...]: ...

    def release_job(self, job_id: str) -> tuple[Attempt, ...]: ...

    def cancel_job(self, job_id: str) -> tuple[Attempt, ...]: ...

    def diagnose(self, job_id: str, nodes: list[str]) -> tuple[Attempt, ...]:
        """Ask for the job's stacks: the applied ``diagnose`` action on the actions topic is the request
        (``collect-stacks`` answers it), so a driver calls nothing on the scheduler for it."""
        ...


class DryRunDriver:
    """Records what it would do and does nothing; its inventory is the one it is given."""

    name = "dry-run"

    def __init__(self, inventory: Inventory | None = None) -> None:
        self._inventory = inventory if inventory is not None else Inventory(complete=False)
        self.commands: list[tuple[str, ...]] = []

    def inventory(self) -> Inventory:
        return self._inventory

    def _record(self, *call: str) -> tuple[Attempt, ...]:
        self.commands.append(call)
        return ()

    def drain_node(self, node: str, reason: str) -> tuple[Attempt, ...]:
        return self._record("drain_node", node, reason)

    def resume_node(self, node: str) -> tuple[Attempt, ...]:
        return self._record("resume_node", node)

    def requeue_job(self, job_id: str, exclude: list[str]) -> tuple[Attempt, ...]:
        return self._record("requeue_job", job_id, ",".join(exclude))

    def hold_job(self, job_id: str) -> tuple[Attempt, ...]:
        return self._record("hold_job", job_id)

    def release_job(self, job_id: str) -> tuple[Attempt, ...]:
        return self._record("release_job", job_id)

    def cancel_job(self, job_id: str) -> tuple[Attempt, ...]:
        return self._record("cancel_job", job_id)

    def diagnose(self, job_id: str, nodes: list[str]) -> tuple[Attempt, ...]:
        return self._record("diagnose", job_id, ",".join(nodes))


# ---------------------------------------------------------------- configuration


class SchedulerSettings(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Which scheduler the action sink may act on, and how its commands are run."""

    driver: Literal["none", "dry-run", "slurm", "kubernetes"] = "none"
    ssh_host: str | None = None  # run the Slurm tools on this host (ssh -o BatchMode=yes)
    bin_dir: str | None = None  # where the Slurm tools are (default: PATH)
    timeout_s: float = 30.0
    attempts: int = 3
    backoff_s: float = 1.0
    namespace: str = "default"  # Kubernetes
    kube_context: str | None = None


def make_driver(settings: SchedulerSettings) -> SchedulerDriver | None:
    """The scheduler driver the settings ask for (``None``: recommendations only)."""
    runner = CommandRunner(
        timeout_s=settings.timeout_s,
        attempts=settings.attempts,
        backoff_s=settings.backoff_s,
        ssh_host=settings.ssh_host,
        bin_dir=settings.bin_dir,
    )
    match settings.driver:
        case "slurm":
            from trainguard.actions.slurm import SlurmDriver

            return SlurmDriver(runner, pending_wait_s=settings.timeout_s)
        case "kubernetes":
            from trainguard.actions.kubernetes import KubernetesDriver

            return KubernetesDriver.from_config(settings.namespace, settings.kube_context)
        case "dry-run":
            return DryRunDriver()
    return None
