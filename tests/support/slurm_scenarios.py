"""Small replay directories about jobs that really run on the test Slurm cluster.

Each builder takes the Slurm job id and the nodes Slurm gave it, and writes a
wire-contract replay: the job running and making progress for a minute, then the
fault. Times are recent wall-clock times, as a live feed's would be.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import msgspec

from trainguard.dataflows.config import Settings
from trainguard.datasets.records import job_record, log_record, rfc3339

RANKS_PER_NODE = 2


def _progress(t0: float, job: str, nodes: list[str], seconds: int) -> list[dict[str, Any]]:
    out = []
    for step in range(seconds):
        for n, node in enumerate(nodes):
            for local in range(RANKS_PER_NODE):
                rank = n * RANKS_PER_NODE + local
                out.append(
                    {
                        "ts": rfc3339(t0 + step + 0.01 * rank),
                        "job_id": job,
                        "node": node,
                        "rank": rank,
                        "step": step,
                        "step_time_s": 1.0,
                    }
                )
    return out


def _write(directory: Path, **topics: list[dict[str, Any]]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for topic, records in topics.items():
        records.sort(key=lambda r: r["ts"])
        (directory / f"{topic}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return directory


def _start(job: str, nodes: list[str]) -> tuple[float, list[dict[str, Any]], list[dict[str, Any]]]:
    t0 = time.time() - 120
    return t0, [job_record(t0, job, "RUNNING", nodes)], _progress(t0, job, nodes, 60)


def xid79(directory: Path, job: str, nodes: list[str], bad: str) -> Path:
    """GPU 3 of ``bad`` falls off the bus; the job's ranks there die."""
    t0, sched, progress = _start(job, nodes)
    tc = t0 + 60
    logs = [
        log_record(
            tc + 0.2,
            None,
            bad,
            None,
            "NVRM: Xid (PCI:0000:4b:00): 79, pid=4411, name=python, GPU has fallen off the bus.",
            "kernel",
        )
    ]
    first = nodes.index(bad) * RANKS_PER_NODE
    logs += [
        log_record(tc + 0.6, job, bad, r, f"[rank{r}]: RuntimeError: CUDA error: unspecified launch failure")
        for r in range(first, first + RANKS_PER_NODE)
    ]
    return _write(directory, scheduler=sched, progress=progress, logs=logs)


def nccl_timeout(directory: Path, job: str, nodes: list[str]) -> Path:
    """Every rank's NCCL watchdog times out, with no hardware evidence anywhere."""
    t0, sched, progress = _start(job, nodes)
    tc = t0 + 60
    logs = [
        log_record(
            tc + 12 + r * 0.01,
            job,
            nodes[r // RANKS_PER_NODE],
            r,
            f"[rank{r}]:[E1201 10:21:00.123456 ProcessGroupNCCL.cpp:607] [Rank {r}] Watchdog caught collective "
            "operation timeout: WorkNCCL(SeqNum=812, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, "
            "Timeout(ms)=10000) ran for 10007 milliseconds before timing out.",
        )
        for r in range(len(nodes) * RANKS_PER_NODE)
    ]
    sched.append(job_record(tc + 14, job, "FAILED", nodes, exit_code=1))
    return _write(directory, scheduler=sched, progress=progress, logs=logs)


def app_error(directory: Path, job: str, nodes: list[str]) -> Path:
    """The training script raises the same exception, twice (before and after a restart)."""
    t0, sched, progress = _start(job, nodes)
    logs = []
    for attempt, tc in enumerate((t0 + 30, t0 + 60)):
        logs += [
            log_record(tc + 0.1, job, nodes[0], 0, "[rank0]: Traceback (most recent call last):"),
            log_record(
                tc + 0.2,
                job,
                nodes[0],
                0,
                "[rank0]: KeyError: 'input_ids' (batch from shard 0007 has no input_ids column)",
            ),
        ]
        if attempt == 0:
            sched.append(job_record(tc + 5, job, "FAILED", nodes, exit_code=1))
            sched.append(job_record(tc + 10, job, "RUNNING", nodes))
    return _write(directory, scheduler=sched, progress=progress, logs=logs)


def xid79_storm(directory: Path, nodes: list[str]) -> Path:
    """Every node reports a GPU fallen off the bus within seconds (a bad driver push, say)."""
    t0 = time.time() - 30
    logs = [
        log_record(
            t0 + i,
            None,
            node,
            None,
            f"NVRM: Xid (PCI:0000:{0x1B + i:02x}:00): 79, pid=1, name=python, GPU has fallen off the bus.",
            "kernel",
        )
        for i, node in enumerate(nodes)
    ]
    return _write(directory, logs=logs)


def settings(tmp_path: Path, mode: str = "enforce", bin_dir: str | None = None) -> Settings:
    return msgspec.convert(
        {
            "policy": {"mode": mode, "breaker": {"max_partition_fraction": 0.5}},
            "scheduler": {"driver": "slurm", "timeout_s": 15, "attempts": 2, "backoff_s": 0.2, "bin_dir": bin_dir},
            "audit_log": str(tmp_path / "audit.jsonl"),
        },
        Settings,
    )
