"""Small real Python processes that pose as a job's ranks, for py-spy to read.

Each rank process runs :data:`RANK_SCRIPT` with the job's environment (``TRAINGUARD_JOB_ID``,
``RANK``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``) and blocks where its role says: in a function
named like a collective (``all_reduce`` → ``threading.Event().wait()``), in ``load_batch``
(sleeping in a loop), or in ``all_reduce`` after forking a data-loader worker that inherits
its environment. A launcher role (no ``RANK``, like torchrun's agent) starts the ranks itself.
Everything started is stopped by PID when the context ends (a stopped one is continued first).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

RANK_SCRIPT = """
import multiprocessing, os, subprocess, sys, threading, time

def all_reduce():
    threading.Event().wait()

def load_batch():
    while True:
        time.sleep(0.05)

def worker_loop():
    threading.Event().wait()

def train_step(role):
    if role == "loader":
        load_batch()
    all_reduce()

def main():
    role = os.environ.get("TG_ROLE", "collective")
    if role == "launcher":  # torchrun's agent: no RANK of its own, starts the ranks
        children = []
        for rank in os.environ["TG_RANKS"].split(","):
            env = dict(os.environ, RANK=rank, LOCAL_RANK=rank, TG_ROLE="collective")
            children.append(subprocess.Popen([sys.executable, __file__], env=env, stdout=subprocess.DEVNULL))
        print("ready " + " ".join(str(c.pid) for c in children), flush=True)
        threading.Event().wait()
    if role == "with_worker":  # a data-loader worker: a forked child with the same environment
        worker = multiprocessing.get_context("fork").Process(target=worker_loop, daemon=True)
        worker.start()
        print(f"ready {worker.pid}", flush=True)
    else:
        print("ready", flush=True)
    train_step(role)

if __name__ == "__main__":
    main()
"""


def job_env(job_id: str, rank: int | None, local_world_size: int, role: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "SLURM_JOB_ID", "SLURM_PROCID")}
    env |= {"TRAINGUARD_JOB_ID": job_id, "LOCAL_WORLD_SIZE": str(local_world_size), "TG_ROLE": role}
    if rank is not None:
        env |= {"RANK": str(rank), "LOCAL_RANK": str(rank)}
    return env


class RankProcesses:
    """The processes started for one test; :meth:`stop` ends them all, by PID."""

    def __init__(self, directory: Path) -> None:
        self.script = directory / "rank.py"
        self.script.write_text(RANK_SCRIPT)
        self.procs: list[subprocess.Popen[str]] = []
        self.extra_pids: list[int] = []  # started by our processes (a launcher's ranks, a forked worker)

    def start(self, env: dict[str, str]) -> tuple[int, list[int]]:
        """Start one process; returns its pid and the pids it says it started, once it is about to block."""
        proc = subprocess.Popen([sys.executable, str(self.script)], env=env, stdout=subprocess.PIPE, text=True)
        self.procs.append(proc)
        assert proc.stdout is not None
        line = proc.stdout.readline().split()
        assert line and line[0] == "ready", f"rank process {proc.pid} did not start"
        children = [int(p) for p in line[1:]]
        self.extra_pids += children
        return proc.pid, children

    def settle(self) -> None:
        time.sleep(0.5)  # from "ready" to inside the blocking call

    def stop(self) -> None:
        for pid in [*self.extra_pids, *(p.pid for p in self.procs)]:
            for sig in (signal.SIGCONT, signal.SIGKILL):
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    break
        for proc in self.procs:
            proc.wait(timeout=10)
            if proc.stdout is not None:
                proc.stdout.close()


@contextmanager
def rank_processes(directory: Path) -> Iterator[RankProcesses]:
    ranks = RankProcesses(directory)
    try:
        yield ranks
    finally:
        ranks.stop()
