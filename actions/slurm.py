"""The Slurm driver: scontrol/squeue/sinfo/scancel as argv lists, locally or over SSH.

Requeueing a job and having it run again quickly takes three steps: ``scontrol
requeue`` (the job goes COMPLETING → PENDING with a begin-time hold-off), then,
once it is PENDING and its old run is surely gone (``restart_delay_s``), ``scontrol
update jobid=… excnodelist=… starttime=now`` so it starts away from the suspect nodes
without waiting for Slurm's own requeue hold-off.
"""

from __future__ import annotations

import json
import time

from trainguard.actions.commands import Attempt, CommandFailed, CommandRunner
from trainguard.actions.drivers import Inventory, JobInfo, NodeInfo
from trainguard.actions.hostlist import expand

_UNAVAILABLE_FLAGS = {"DRAIN", "DRAINING", "DRAINED", "FAIL", "NOT_RESPONDING"}


class SlurmDriver:
    """Acts on a Slurm cluster through its command-line tools."""

    name = "slurm"

    def __init__(
        self, runner: CommandRunner | None = None, pending_wait_s: float = 30.0, restart_delay_s: float = 5.0
    ) -> None:
        self.runner = runner or CommandRunner()
        self.pending_wait_s = pending_wait_s
        self.restart_delay_s = restart_delay_s

    # ------------------------------------------------------------ reading

    def inventory(self) -> Inventory:
        nodes_doc = json.loads(self.runner.run(["sinfo", "--json"]).stdout)
        jobs_doc = json.loads(self.runner.run(["squeue", "--json", "--states=all"]).stdout)
        return parse_inventory(nodes_doc, jobs_doc)

    def job_state(self, job_id: str) -> str:
        out = self.runner.run(["squeue", "--noheader", "--states=all", "--jobs", job_id, "--format=%T"]).stdout
        return out.strip()

    # ------------------------------------------------------------ acting

    def drain_node(self, node: str, reason: str) -> tuple[Attempt, ...]:
        return self.runner.run(["scontrol", "update", f"nodename={node}", "state=drain", f"reason={reason}"]).attempts

    def resume_node(self, node: str) -> tuple[Attempt, ...]:
        return self.runner.run(["scontrol", "update", f"nodename={node}", "state=resume"]).attempts

    def requeue_job(self, job_id: str, exclude: list[str]) -> tuple[Attempt, ...]:
        held = self.runner.run(["squeue", "--noheader", "--states=all", "--jobs", job_id, "--format=%N"]).stdout
        attempts = list(self.runner.run(["scontrol", "requeue", job_id]).attempts)
        attempts += self._wait_pending(job_id)
        # Starting the job again before its old run is gone lets that run's dying srun
        # ("forcing job termination", up to KillWait + 2 s later) kill the new one: wait
        # until the old nodes stopped completing, then a little longer.
        attempts += self._wait_released(held.strip())
        time.sleep(self.restart_delay_s)
        update = ["scontrol", "update", f"jobid={job_id}", "starttime=now"]
        if exclude:
            update.insert(3, f"excnodelist={','.join(exclude)}")
        attempts += self.runner.run(update).attempts
        return tuple(attempts)

    def hold_job(self, job_id: str) -> tuple[Attempt, ...]:
        # A running job keeps running under a plain hold: requeue it held instead.
        verb = "requeuehold" if self.job_state(job_id) in ("RUNNING", "SUSPENDED") else "hold"
        return self.runner.run(["scontrol", verb, job_id]).attempts

    def release_job(self, job_id: str) -> tuple[Attempt, ...]:
        attempts = self.runner.run(["scontrol", "release", job_id]).attempts
        if self.job_state(job_id) != "PENDING":  # already started (or gone): nothing to hurry
            return attempts
        return attempts + self.runner.run(["scontrol", "update", f"jobid={job_id}", "starttime=now"]).attempts

    def cancel_job(self, job_id: str) -> tuple[Attempt, ...]:
        return self.runner.run(["scancel", job_id]).attempts

    def diagnose(self, job_id: str, nodes: list[str]) -> tuple[Attempt, ...]:
        # The request is the applied action on the actions topic (collect-stacks answers it): no Slurm command.
        return ()

    def _wait_released(self, hostlist: str) -> tuple[Attempt, ...]:
        if not hostlist:
            return ()
        deadline = time.monotonic() + self.pending_wait_s
        while time.monotonic() < deadline:
            states = self.runner.run(["sinfo", "--noheader", "--Node", f"--nodes={hostlist}", "--format=%t"]).stdout
            if "comp" not in states:
                return ()
            time.sleep(0.1)
        raise CommandFailed(f"nodes {hostlist} were still completing {self.pending_wait_s:g} s after the requeue", ())

    def _wait_pending(self, job_id: str) -> tuple[Attempt, ...]:
        deadline = time.monotonic() + self.pending_wait_s
        while time.monotonic() < deadline:
            if self.job_state(job_id) == "PENDING":
                return ()
            time.sleep(0.1)
        raise CommandFailed(f"job {job_id} was not PENDING {self.pending_wait_s:g} s after the requeue", ())


def parse_inventory(nodes_doc: dict, jobs_doc: dict) -> Inventory:
    """Inventory from ``sinfo --json`` and ``squeue --json`` documents (Slurm 22.05 shapes)."""
    nodes: dict[str, NodeInfo] = {}
    for n in nodes_doc.get("nodes", []):
        flags = {str(f).upper() for f in n.get("state_flags") or []}
        state = str(n.get("state", "unknown")).lower()
        nodes[n["name"]] = NodeInfo(
            name=n["name"],
            state=state,
            partitions=tuple(n.get("partitions") or ()),
            drained=bool(flags & _UNAVAILABLE_FLAGS),
            reason=n.get("reason") or "",
        )
    jobs: dict[str, JobInfo] = {}
    for j in jobs_doc.get("jobs", []):
        job_id = str(j["job_id"])
        jobs[job_id] = JobInfo(
            job_id=job_id,
            name=j.get("name") or "",
            state=str(j.get("job_state", "")).upper(),
            partition=j.get("partition") or "",
            nodes=tuple(expand(j.get("nodes") or "")),
            restarts=int(j.get("restart_cnt") or 0),
            held=j.get("priority") == 0 and str(j.get("job_state", "")).upper() == "PENDING",
        )
    return Inventory(nodes=nodes, jobs=jobs)
