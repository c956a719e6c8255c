"""The faults of ``trainguard bench realjob`` and the real-job tests, one real job each (needs torch).

Each function starts a :class:`~trainguard.benchmarks.realjob.RealJob` on a running
:class:`~trainguard.benchmarks.realjob.Cluster`, injects one fault from outside the job, and returns
an :class:`Outcome`: the anomaly the fault should raise (or none), and how long it took on the wall
clock. :func:`bench` runs them in turns and prints a table (docs/benchmarks.md).
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from trainguard.benchmarks.realjob import NODE, Arrival, Cluster, RealJob, new_cluster


@dataclass
class Outcome:
    """What one faulted job raised: the anomaly the fault should raise (``None``: none) and its latency.

    ``latency_s``: wall clock from the injection to the anomaly on the topic — for a hang, from the job's
    last step (the anomaly's ``onset_ts``), since a hang cannot be told before the deadline after it.
    """

    fault: str
    job: RealJob
    found: Arrival | None
    latency_s: float | None
    opened: list[dict[str, Any]]
    revision: dict[str, Any] | None = None  # the found anomaly once the ranks' stacks were attached
    stacks: list[dict[str, Any]] = field(default_factory=list)  # the ranks' stacks, dumped again by the harness

    @property
    def kinds(self) -> list[tuple[str, str]]:
        return [(a["kind"], a["category"]) for a in self.opened]


def _outcome(fault: str, job: RealJob, kind: str | None, since: float | None, timeout_s: float) -> Outcome:
    found = None if kind is None else job.cluster.wait_for(job.job_id, kind, timeout_s)
    if found is not None and since is None:
        since = found.record["onset_ts"]
    latency = None if found is None or since is None else found.at - since
    return Outcome(fault, job, found, latency, [])


def _settle(outcome: Outcome, seconds: float) -> Outcome:
    """Wait ``seconds`` for late records, then take the job's opened anomalies."""
    time.sleep(seconds)
    outcome.opened = [a.record for a in outcome.job.cluster.opened(outcome.job.job_id)]
    return outcome


def kill(cluster: Cluster, job_id: str, settle: bool = True) -> Outcome:
    """``SIGKILL`` of rank 2 mid-run (the OOM killer, a person): a crash whose root cause is rank 2."""
    job = RealJob(cluster, job_id, "--steps", "500").start()
    try:
        job.wait_step(20)
        outcome = _outcome("kill", job, "crash", job.signal(2, signal.SIGKILL), 30)
        job.wait_exit(60)
        return _settle(outcome, 5 if settle else 0)
    finally:
        job.stop()


def stop(cluster: Cluster, job_id: str, settle: bool = True) -> Outcome:
    """``SIGSTOP`` of rank 2 (a frozen process): a hang named from its silence, then from its stack (the flow's
    diagnose action, answered by the node's stack agent). With ``settle``, the job runs on until gloo times out
    (45 s) and torchelastic kills the stopped rank (30 s later): those lines join the hang."""
    job = RealJob(cluster, job_id, "--steps", "1000", "--timeout-s", "45").start()
    try:
        job.wait_step(20)
        job.signal(2, signal.SIGSTOP)
        outcome = _outcome("stop", job, "hang", None, 75)
        if settle and outcome.found is not None:
            outcome.revision = cluster.revised(outcome.found.record["anomaly_id"], 20)
            outcome.stacks = _dump(job)
            job.wait_exit(120)
        return _settle(outcome, 5 if settle else 0)
    finally:
        job.stop()


def stall(cluster: Cluster, job_id: str, settle: bool = True) -> Outcome:
    """Rank 1 stuck in its own data loader (alive, beating, in ``time.sleep``) while its peers wait in
    ``all_reduce``: a hang at the logs-only deadline, its culprit named from the ranks' stacks."""
    with _cancelled_after(RealJob(cluster, job_id, "--steps", "1000").start()) as job:
        job.wait_step(20)
        job.fault(1, "stall")
        outcome = _outcome("stall", job, "hang", None, 100)
        if outcome.found is not None:
            outcome.revision = cluster.revised(outcome.found.record["anomaly_id"], 30)
        return _settle(outcome, 0)


def _dump(job: RealJob) -> list[dict[str, Any]]:
    from trainguard.agents.stacks import dump_job

    return dump_job(job.job_id, NODE)


@contextlib.contextmanager
def _cancelled_after(job: RealJob) -> Iterator[RealJob]:
    """The job, cancelled (as ``scancel`` would) and stopped once the scenario is over."""
    try:
        yield job
    finally:
        job.cancel()
        job.wait_exit(60, "CANCELLED")
        job.stop()


def slow(cluster: Cluster, job_id: str, settle: bool = True) -> Outcome:
    """Rank 2's data loader waits 50 % of a step more per batch (a starved input pipeline): a straggler."""
    with _cancelled_after(RealJob(cluster, job_id, "--steps", "600").start()) as job:
        job.wait_step(30)
        return _settle(_outcome("slow", job, "straggler", job.fault(2, "slow 0.11"), 70), 0)


def nan(cluster: Cluster, job_id: str, settle: bool = True) -> Outcome:
    """One corrupted batch on rank 1: the reduced loss and every gradient turn NaN."""
    with _cancelled_after(RealJob(cluster, job_id, "--steps", "600").start()) as job:
        job.wait_step(20)
        return _settle(_outcome("nan", job, "numerics", job.fault(1, "nan"), 40), 0)


def healthy(cluster: Cluster, job_id: str, settle: bool = True) -> Outcome:
    """A healthy run: a ~90 s ``torch.save`` to a slow filesystem after step 30 (torchtitan's own messages),
    an evaluation loop of 40 s that prints nothing after step 60, completion at step 90. Nothing to raise."""
    args = ["--steps", "90", "--ckpt-at", "30", "--ckpt-mib", "90", "--ckpt-mib-per-s", "1.0"]
    job = RealJob(cluster, job_id, *args, "--eval-at", "60", "--eval-s", "40", "--timeout-s", "150").start()
    try:
        if job.wait_exit(300) != 0:
            raise RuntimeError(f"the healthy job failed: {job.launcher_output()[-2000:]}")
        return _settle(Outcome("healthy", job, None, None, []), 8)
    finally:
        job.stop()


def cancel(cluster: Cluster, job_id: str, settle: bool = True) -> Outcome:
    """The whole job cancelled as ``scancel`` does (SIGTERM to the launcher), with no scheduler to say so:
    the launcher's own lines tell the end. Nothing to raise."""
    job = RealJob(cluster, job_id, "--steps", "600").start()
    try:
        job.wait_step(20)
        job.cancel()
        job.launcher.wait(60)
        # A held cascade would be reported 10 s after it began; a hang 55 s after the last step.
        return _settle(Outcome("cancel", job, None, None, []), 20)
    finally:
        job.stop()


FAULTS = {"kill": kill, "stop": stop, "stall": stall, "slow": slow, "nan": nan, "healthy": healthy, "cancel": cancel}
EXPECTED = {  # what each fault must raise: kind, category, ranks (None: not checked)
    "kill": ("crash", "process_crash", [2]),
    "stop": ("hang", "no_progress", [2]),
    "stall": ("hang", "no_progress", None),  # named from stacks: see the revision
    "slow": ("straggler", None, [2]),
    "nan": ("numerics", "nan_loss", None),
}


def bench(faults: list[str], repeat: int) -> None:
    """``trainguard bench realjob``: each fault ``repeat`` times on a fresh job; latency and root cause per fault."""
    import statistics

    cluster = new_cluster()
    results: dict[str, list[Outcome]] = {f: [] for f in faults}
    try:
        time.sleep(3)
        for round_ in range(repeat):
            for fault in faults:  # faults take turns, so each meets the machine in the same moods
                results[fault].append(FAULTS[fault](cluster, f"bench-{fault}-{round_}", settle=False))
                print(f"  round {round_ + 1} {fault}: {_verdict(results[fault][-1])}", flush=True)
    finally:
        cluster.stop()
    print(f"\nreal torchrun job, 4 gloo ranks on {os.cpu_count()} cores, {repeat} rounds; latency on the wall clock")
    print("| fault | raised as | root cause right | latency median | max |")
    print("|---|---|---|---|---|")
    for fault, outcomes in results.items():
        latencies = [o.latency_s for o in outcomes if o.latency_s is not None]
        right = sum(_verdict(o) == "right" for o in outcomes)
        raised = {f"{o.found.record['kind']}/{o.found.record['category']}" for o in outcomes if o.found} or {"nothing"}
        median = f"{statistics.median(latencies):.1f} s" if latencies else "-"
        worst = f"{max(latencies):.1f} s" if latencies else "-"
        print(f"| {fault} | {', '.join(sorted(raised))} | {right}/{len(outcomes)} | {median} | {worst} |")


def _verdict(outcome: Outcome) -> str:
    want = EXPECTED.get(outcome.fault)
    if want is None:
        return "right" if not outcome.opened else f"raised {outcome.kinds}"
    if outcome.found is None:
        return "missed"
    record = outcome.found.record
    if outcome.fault == "stall":  # named from the ranks' stacks, in the revision
        record = outcome.revision or {**record, "ranks": None}
        want = ("hang", "no_progress", [1])
    kind, category, ranks = want
    ok = record["kind"] == kind and category in (None, record["category"]) and ranks in (None, record["ranks"])
    return "right" if ok else f"wrong: {record['kind']}/{record['category']} ranks {record['ranks']}"
