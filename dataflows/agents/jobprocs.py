"""A job's rank processes on this host, found in ``/proc``.

A process belongs to job ``J`` when its environment says so — ``TRAINGUARD_JOB_ID``,
``SLURM_JOB_ID`` or ``TORCHELASTIC_RUN_ID`` equals ``J`` — and its rank is ``RANK``
(torchrun's workers), else ``SLURM_PROCID`` (``srun python train.py``). Not every such
process is a rank:

- torchrun's agent has no ``RANK`` (under ``srun`` it has ``SLURM_PROCID``): once any
  process of the job has ``RANK``, those without it are launchers and are skipped;
- data-loader workers and compile workers inherit their rank's environment: of the
  processes with one rank, only the topmost (whose parent has another rank, or none) is
  the rank; shells and ``srun`` wrappers are not Python and are skipped;
- the ranks this node should run follow from ``LOCAL_RANK``/``LOCAL_WORLD_SIZE`` (or
  Slurm's ``SLURM_LOCALID`` and tasks per node): one of them that no process has is
  reported *missing*.

Reading another user's ``environ`` needs that user or root, as py-spy itself does.

>>> tasks_on_node("4(x2),3", 2), tasks_on_node("8", 0), tasks_on_node("bogus", 0)
(3, 8, None)
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

__all__ = ["JobProcess", "job_processes", "process_state", "tasks_on_node"]

JOB_VARIABLES = ("TRAINGUARD_JOB_ID", "SLURM_JOB_ID", "TORCHELASTIC_RUN_ID")
# /proc/PID/stat's state letter, in the words of the stacks record.
_STATES = {"R": "running", "S": "sleeping", "I": "sleeping", "D": "disk", "T": "stopped", "t": "stopped"}
_STATES |= {"Z": "zombie", "X": "gone"}
_TASKS = re.compile(r"^(\d+)(?:\(x(\d+)\))?$")


@dataclass(frozen=True)
class JobProcess:
    """One rank process of the job on this host; ``pid`` is ``None`` for a rank that is missing."""

    rank: int
    pid: int | None
    state: str  # running, sleeping, disk, stopped, zombie, gone
    expected: tuple[int, ...] = ()  # the ranks this node should run, when the environment says


@dataclass(frozen=True)
class _Candidate:
    pid: int
    ppid: int
    state: str
    python: bool
    env: dict[str, str]


def process_state(pid: int, proc: Path = Path("/proc")) -> tuple[str, int] | None:
    """``(state, parent pid)`` from ``/proc/PID/stat``; ``None`` when the process is gone."""
    try:
        stat = (proc / str(pid) / "stat").read_text()
    except OSError:
        return None
    # The command name is in parentheses and may hold spaces or parentheses itself: read after the last one.
    fields = stat[stat.rfind(")") + 2 :].split()
    return _STATES.get(fields[0], "running"), int(fields[1])


def _environ(pid: int, proc: Path) -> dict[str, str] | None:
    try:
        raw = (proc / str(pid) / "environ").read_bytes()
    except OSError:  # gone, or another user's (this agent runs as root or as the job's user)
        return None
    env: dict[str, str] = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep and key in _WANTED:
            env[key.decode()] = value.decode(errors="replace")
    return env


_WANTED = {
    v.encode()
    for v in (
        *JOB_VARIABLES,
        "RANK",
        "LOCAL_RANK",
        "LOCAL_WORLD_SIZE",
        "SLURM_PROCID",
        "SLURM_LOCALID",
        "SLURM_NODEID",
        "SLURM_NTASKS_PER_NODE",
        "SLURM_TASKS_PER_NODE",
    )
}


def _is_python(pid: int, proc: Path) -> bool:
    try:
        exe = os.readlink(proc / str(pid) / "exe")
    except OSError:  # a zombie has no executable any more: its command name still says
        try:
            exe = (proc / str(pid) / "comm").read_text().strip()
        except OSError:
            return False
    return Path(exe).name.startswith("python")


def tasks_on_node(tasks_per_node: str, node_index: int) -> int | None:
    """How many tasks Slurm's ``SLURM_TASKS_PER_NODE`` (``4(x2),3``) puts on the ``node_index``-th node."""
    counts: list[int] = []
    for part in tasks_per_node.split(","):
        m = _TASKS.match(part.strip())
        if m is None:
            return None
        counts += [int(m[1])] * int(m[2] or 1)
    return counts[node_index] if 0 <= node_index < len(counts) else None


def _rank(env: dict[str, str], use_rank: bool) -> int | None:
    value = env.get("RANK") if use_rank else env.get("SLURM_PROCID")
    return int(value) if value is not None and value.isdigit() else None


def _expected(env: dict[str, str], rank: int, use_rank: bool) -> tuple[int, ...]:
    """The ranks of this process's node, assuming consecutive ranks per node (torchrun's and srun's block layout)."""
    if use_rank:
        local, size = env.get("LOCAL_RANK"), env.get("LOCAL_WORLD_SIZE")
    else:
        local, size = env.get("SLURM_LOCALID"), env.get("SLURM_NTASKS_PER_NODE")
        node_index = env.get("SLURM_NODEID", "")
        if size is None and node_index.isdigit() and "SLURM_TASKS_PER_NODE" in env:
            count = tasks_on_node(env["SLURM_TASKS_PER_NODE"], int(node_index))
            size = str(count) if count is not None else None
    if local is None or size is None or not local.isdigit() or not size.isdigit():
        return ()
    base = rank - int(local)
    return tuple(range(base, base + int(size))) if base >= 0 else ()


def job_processes(job_id: str, proc: Path = Path("/proc"), skip: set[int] | None = None) -> list[JobProcess]:
    """The job's rank processes on this host, and the ranks it should run here that none has; by rank."""
    skip = skip if skip is not None else _own_lineage(proc)
    candidates: list[_Candidate] = []
    for entry in proc.iterdir():
        if not entry.name.isdigit() or int(entry.name) in skip:
            continue
        pid = int(entry.name)
        env = _environ(pid, proc)
        if not env or not any(env.get(v) == job_id for v in JOB_VARIABLES):
            continue
        state = process_state(pid, proc)
        if state is None:
            continue
        candidates.append(_Candidate(pid, state[1], state[0], _is_python(pid, proc), env))
    use_rank = any("RANK" in c.env for c in candidates)  # else launched by srun alone: SLURM_PROCID is the rank
    by_rank: dict[int, list[_Candidate]] = {}
    for c in candidates:
        rank = _rank(c.env, use_rank)
        if rank is not None and c.python:
            by_rank.setdefault(rank, []).append(c)
    out: list[JobProcess] = []
    expected: set[int] = set()
    for rank, same in by_rank.items():
        pids = {c.pid for c in same}
        top = min((c for c in same if c.ppid not in pids), key=lambda c: c.pid, default=min(same, key=lambda c: c.pid))
        ranks_here = _expected(top.env, rank, use_rank)
        expected.update(ranks_here)
        out.append(JobProcess(rank, top.pid, top.state, ranks_here))
    out += [JobProcess(rank, None, "gone") for rank in sorted(expected - by_rank.keys())]
    return sorted(out, key=lambda p: p.rank)


def _own_lineage(proc: Path) -> set[int]:
    """This process and its ancestors: an agent started inside the job's allocation is not one of its ranks."""
    lineage: set[int] = set()
    pid = os.getpid()
    while pid > 1 and pid not in lineage:
        lineage.add(pid)
        state = process_state(pid, proc)
        if state is None:
            break
        pid = state[1]
    return lineage
