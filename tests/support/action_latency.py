"""Benchmark: action latency on the real four-node Slurm cluster.

From the moment an anomaly is emitted (handed to the action step, as the flow
does) to the moment the scheduler shows the effect: the node drained, the job
requeued (its restart count moves), the job running again on other nodes.

    python -m tests.support.action_latency [--trials 20]

Needs root and Debian's slurmctld slurmd slurm-client munge (as the tests do).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.support.slurm_cluster import SlurmCluster, start, stop
from trainguard.actions.commands import CommandRunner
from trainguard.actions.executor import ActionExecutor
from trainguard.actions.hostlist import expand
from trainguard.actions.policy import Policy, PolicyConfig
from trainguard.actions.slurm import SlurmDriver
from trainguard.dataflows.action_step import BackgroundExecutor
from trainguard.detectors.events import Anomaly


def _node_drained(cluster: SlurmCluster, node: str) -> bool:
    out = subprocess.run(["sinfo", "-h", "-n", node, "-o", "%t"], capture_output=True, text=True, env=_env(cluster))
    return "drain" in out.stdout or "drng" in out.stdout


def _job(cluster: SlurmCluster, job: str) -> tuple[str, int, str]:
    out = subprocess.run(
        ["scontrol", "show", "job", job, "-o"], capture_output=True, text=True, env=_env(cluster)
    ).stdout
    fields = dict(kv.split("=", 1) for kv in out.split() if "=" in kv)
    return fields.get("JobState", ""), int(fields.get("Restarts", "0")), fields.get("NodeList", "")


def _env(cluster: SlurmCluster) -> dict[str, str]:
    return {**os.environ, **cluster.env}


def trial(cluster: SlurmCluster, n: int) -> dict[str, float]:
    cluster.reset()
    job, nodes = cluster.submit(nodes=2)
    bad = nodes[1]
    config = PolicyConfig(mode="enforce")
    config.breaker.max_partition_fraction = 0.5
    executor = BackgroundExecutor(ActionExecutor(config, SlurmDriver(CommandRunner(timeout_s=15, attempts=2))))
    executor.wait()
    anomaly = Anomaly(
        anomaly_id=f"an-bench-{n}",
        detected_at=time.time(),
        kind="crash",
        category="xid_79",
        layer="hardware",
        transient=False,
        job_id=job,
        nodes=[bad],
    )
    decisions = [(anomaly, a) for a in Policy(config).decide(anomaly)]
    t0 = time.monotonic()
    executor.submit(decisions)
    marks: dict[str, float] = {}
    while len(marks) < 3 and time.monotonic() - t0 < 60:
        now = time.monotonic() - t0
        if "drained" not in marks and _node_drained(cluster, bad):
            marks["drained"] = now
        state, restarts, where = _job(cluster, job)
        if "requeued" not in marks and restarts >= 1:
            marks["requeued"] = now
        if "running_again" not in marks and restarts >= 1 and state == "RUNNING" and bad not in expand(where):
            marks["running_again"] = now
        time.sleep(0.005)
    executor.wait()
    return marks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=20)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="tg-slurm-bench-"))
    cluster = start(root)
    os.environ.update(cluster.env)  # the driver's scontrol/squeue/sinfo must find this cluster
    try:
        results = []
        for n in range(args.trials):
            results.append(trial(cluster, n))
            print(f"trial {n}: {results[-1]}", file=sys.stderr, flush=True)
    finally:
        stop(root)
    report = {}
    for key in ("drained", "requeued", "running_again"):
        values = sorted(r[key] for r in results if key in r)
        report[key] = {
            "n": len(values),
            "p50_s": round(statistics.median(values), 3),
            "p95_s": round(values[min(len(values) - 1, int(0.95 * len(values)))], 3),
            "max_s": round(values[-1], 3),
        }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
