"""A small labelled cluster scenario: the bundled demo and the test fixture.

It follows the failure physics of docs/architecture.md ("Failure physics"): ranks of a synchronous job share
one step time, only rank 0 prints Megatron iteration lines, a slow GPU shows up
as a job-wide step-time rise that only per-rank compute time and GPU metrics
localise, a hang is silence (the NCCL watchdog speaks ten minutes later), and a
crash makes every rank print a cascade. Benign pauses (a checkpoint save, an
evaluation phase, a user's cancel) are there to be ignored.

``python -m trainguard.datasets.scenario OUT_DIR [--seed N]`` writes a replay directory.
"""

from __future__ import annotations

import argparse
import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import msgspec

BASE_TS = datetime(2026, 12, 1, 10, 0, tzinfo=UTC).timestamp()
GPUS_PER_NODE = 8


def rfc3339(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def log_record(
    ts: float, job_id: str | None, node: str, rank: int | None, line: str, source: str = "app"
) -> dict[str, Any]:
    """A wire-contract ``logs`` record."""
    rec: dict[str, Any] = {"ts": rfc3339(ts), "job_id": job_id, "node": node, "source": source, "line": line}
    if rank is not None:
        rec["rank"] = rank
    return rec


def job_record(ts: float, job_id: str, state: str, nodes: list[str], exit_code: int | None = None) -> dict[str, Any]:
    """A wire-contract ``scheduler`` job record."""
    rec: dict[str, Any] = {
        "ts": rfc3339(ts),
        "kind": "job",
        "job_id": job_id,
        "state": state,
        "nodes": nodes,
        "ranks_per_node": GPUS_PER_NODE,
    }
    if exit_code is not None:
        rec["exit_code"] = exit_code
    return rec


def gpu_sample(rng: random.Random, t: float, node: str, g: int, counters: list[int], busy: bool) -> dict[str, Any]:
    """One NVML sample: a busy GPU near full load, or an idle one; counters are cumulative."""
    return {
        "ts": round(t + rng.uniform(0, 0.5), 3),
        "node": node,
        "gpu": g,
        "util_pct": rng.uniform(92, 100) if busy else 0.0,
        "mem_used_mib": 61000 + rng.uniform(-500, 500) if busy else 500.0,
        "temp_c": rng.uniform(62, 68) if busy else rng.uniform(32, 36),
        "power_w": rng.uniform(520, 600) if busy else rng.uniform(65, 75),
        "sm_clock_mhz": 1980.0 if busy else 345.0,
        "ecc_sbe_total": counters[0],
        "ecc_dbe_total": counters[1],
        "pcie_replay_total": counters[2],
        "nvlink_crc_total": counters[3],
        "throttle_reasons": 0,
        "xid": None,
    }


def hung_profile(rng: random.Random, spinning: bool) -> dict[str, Any]:
    """During a hang: healthy GPUs spin in NCCL kernels (util ~100 %, low power); the culprit idles."""
    return {
        "util_pct": rng.uniform(97, 100) if spinning else 0.0,
        "power_w": rng.uniform(130, 160) if spinning else rng.uniform(65, 75),
        "temp_c": rng.uniform(45, 50) if spinning else rng.uniform(35, 38),
        "sm_clock_mhz": 1980.0 if spinning else 345.0,
    }


def phase_profile(rng: random.Random, phase: str) -> dict[str, Any]:
    """During a benign pause: an evaluation keeps the GPUs computing (forward passes, near training
    power); a checkpoint write leaves them idle while the host writes."""
    if phase.startswith("eval"):
        return {"util_pct": rng.uniform(85, 99), "power_w": rng.uniform(420, 540), "sm_clock_mhz": 1980.0}
    return {"util_pct": rng.uniform(0, 3), "power_w": rng.uniform(70, 90), "sm_clock_mhz": 345.0}


def throttled_profile(rng: random.Random) -> dict[str, Any]:
    """A GPU slowed by heat: lower SM clock, hot, thermal slowdown reason set."""
    return {"sm_clock_mhz": 1410.0, "temp_c": rng.uniform(86, 89), "throttle_reasons": 0x20}


@dataclass
class Job:
    job_id: str
    nodes: list[str]
    start: float
    end: float
    step_s: float
    end_state: str = "COMPLETED"
    per_rank_progress: bool = False
    stop_progress_at: float | None = None  # silence from here (crash or hang)
    slow_from: float | None = None
    slow_rank: int | None = None
    slow_factor: float = 1.6
    pauses: list[tuple[float, float, str]] = field(default_factory=list)  # (start, seconds, phase)

    @property
    def ranks(self) -> int:
        return len(self.nodes) * GPUS_PER_NODE

    def node_of(self, rank: int) -> str:
        return self.nodes[rank // GPUS_PER_NODE]


@dataclass
class Scenario:
    seed: int = 0
    duration_s: float = 45 * 60
    gpu_interval_s: float = 10.0
    records: dict[str, list[dict[str, Any]]] = field(
        default_factory=lambda: {"logs": [], "progress": [], "gpu": [], "scheduler": [], "labels": []}
    )

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)

    # -- writers ---------------------------------------------------------------------
    def log(self, ts: float, job: str | None, node: str, rank: int | None, line: str, source: str = "app") -> None:
        self.records["logs"].append(log_record(ts, job, node, rank, line, source))

    def sched_job(self, ts: float, job: Job, state: str, exit_code: int | None = None) -> None:
        self.records["scheduler"].append(job_record(ts, job.job_id, state, job.nodes, exit_code))

    def label(self, **fields: Any) -> None:
        fields["onset_ts"] = rfc3339(fields["onset_ts"])
        self.records["labels"].append(fields)

    # -- generators ---------------------------------------------------------------------
    def run_job(self, job: Job) -> None:
        rng = self.rng
        self.sched_job(job.start, job, "RUNNING")
        ts = job.start + 25.0  # launcher, imports, first compile
        step = 0
        pauses = sorted(job.pauses)
        while ts < job.end and (job.stop_progress_at is None or ts < job.stop_progress_at):
            if pauses and ts >= pauses[0][0]:
                _start, seconds, phase = pauses.pop(0)
                if phase == "checkpoint":
                    self.log(
                        ts,
                        job.job_id,
                        job.nodes[0],
                        0,
                        f"[default0]: saving checkpoint at iteration {step} to /ckpt/{job.job_id}",
                    )
                    self.log(
                        ts + seconds,
                        job.job_id,
                        job.nodes[0],
                        0,
                        f"[default0]:   successfully saved checkpoint at iteration {step} to /ckpt",
                    )
                else:
                    self.log(ts, job.job_id, job.nodes[0], 0, "[default0]: Running Evaluation")
                    self.log(ts + seconds, job.job_id, job.nodes[0], 0, "[default0]: evaluation done")
                ts += seconds
            slow = job.slow_from is not None and ts >= job.slow_from
            compute = {r: job.step_s * 0.7 * rng.uniform(0.97, 1.03) for r in range(job.ranks)}
            if slow and job.slow_rank is not None:
                compute[job.slow_rank] *= job.slow_factor
            step_time = max(compute.values()) / 0.7 * rng.uniform(0.99, 1.01)
            if step < 3:
                step_time *= 3.0  # warm-up steps are slow
            ts += step_time
            step += 1
            if job.per_rank_progress:
                for r in range(job.ranks):
                    self.records["progress"].append(
                        {
                            "ts": ts + rng.uniform(0, 0.05),
                            "job_id": job.job_id,
                            "node": job.node_of(r),
                            "rank": r,
                            "step": step,
                            "step_time_s": round(step_time, 4),
                            "compute_time_s": round(compute[r], 4),
                        }
                    )
            else:
                self.log(
                    ts,
                    job.job_id,
                    job.nodes[0],
                    0,
                    f"[default0]: iteration {step:>8}/  100000 | consumed samples: {step * 512:>10} | "
                    f"elapsed time per iteration (ms): {step_time * 1000:.1f} | learning rate: 1.000E-04 | "
                    f"global batch size:   512 | lm loss: {2.5 - step * 1e-4:.6E} | grad norm: 0.31 |",
                )

    def gpu_samples(
        self,
        nodes: list[str],
        busy: dict[str, tuple[float, float]],
        missing: dict[tuple[str, int], float],
        slow_gpu: dict[tuple[str, int], float],
        xids: dict[tuple[str, int], tuple[float, int]],
        hung: dict[str, tuple[float, float, int | None]] | None = None,
        degrading: dict[tuple[str, int], float] | None = None,
        resets: dict[str, float] | None = None,
    ) -> None:
        """One sample per GPU per interval. ``hung``: node -> (from, until, culprit GPU): healthy
        GPUs of a hung job spin in NCCL kernels (util ~100 %, low power), the culprit idles."""
        rng = self.rng
        hung = hung or {}
        degrading = degrading or {}  # (node, gpu) -> from: corrected ECC errors climb, then a row remap
        resets = dict(resets or {})  # node -> when a driver reload zeroes its counters
        counters = {
            (n, g): [rng.randint(0, 40), 0, rng.randint(0, 5), rng.randint(0, 3)]
            for n in nodes
            for g in range(GPUS_PER_NODE)
        }
        t = BASE_TS
        while t < BASE_TS + self.duration_s:
            for node in nodes:
                start, end = busy.get(node, (0.0, 0.0))
                active = start <= t < end
                for g in range(GPUS_PER_NODE):
                    if (node, g) in missing and t >= missing[(node, g)]:
                        continue
                    c = counters[(node, g)]
                    if node in resets and t >= resets[node]:
                        c[:] = [0, 0, 0, 0]
                    if rng.random() < 0.01:
                        c[0] += 1
                    degrading_since = degrading.get((node, g))
                    if degrading_since is not None and t >= degrading_since:
                        c[0] += rng.randint(15, 30)
                    sample = gpu_sample(rng, t, node, g, c, active)
                    if degrading_since is not None and t >= degrading_since + 900:
                        sample["remapped_rows_pending"] = 1
                    hang = hung.get(node)
                    if hang is not None and hang[0] <= t < hang[1]:
                        spinning = g != hang[2]
                        sample.update(hung_profile(rng, spinning))
                    if active and (node, g) in slow_gpu and t >= slow_gpu[(node, g)]:
                        sample.update(throttled_profile(rng))
                    xid = xids.get((node, g))
                    if xid is not None and xid[0] <= t < xid[0] + self.gpu_interval_s:
                        sample["xid"] = xid[1]
                    self.records["gpu"].append(sample)
            for node in [n for n, when in resets.items() if t >= when]:
                del resets[node]  # a reload happens once
            t += self.gpu_interval_s

    def write(self, out: Path) -> Path:
        out.mkdir(parents=True, exist_ok=True)
        enc = msgspec.json.Encoder()

        def ts_of(rec: dict[str, Any]) -> float:
            ts = rec.get("onset_ts", rec.get("ts"))
            return ts if isinstance(ts, float) else datetime.fromisoformat(ts).timestamp()

        for topic, recs in self.records.items():
            recs.sort(key=ts_of)
            with (out / f"{topic}.jsonl").open("wb") as fh:
                fh.writelines(enc.encode(r) + b"\n" for r in recs)
        return out


def demo(seed: int = 0) -> Scenario:
    """Five jobs on twelve nodes for 45 minutes: a crash, a hang, a straggler, a degrading idle GPU,
    and benign look-alikes (checkpoint, evaluation, user cancel, counter reset)."""
    sc = Scenario(seed=seed)
    m = 60.0
    t0 = BASE_TS
    nodes = [f"gpu-node-{i:02d}" for i in range(1, 13)]
    steady = Job("1001", nodes[0:2], t0 + 1 * m, t0 + 40 * m, 2.0, pauses=[(t0 + 15 * m, 150.0, "checkpoint")])
    crash = Job("1002", nodes[2:4], t0 + 2 * m, t0 + 45 * m, 1.5, end_state="FAILED", stop_progress_at=t0 + 20 * m)
    hang = Job("1003", nodes[4:6], t0 + 2 * m, t0 + 45 * m, 2.5, end_state="FAILED", stop_progress_at=t0 + 25 * m)
    slow = Job(
        "1004",
        nodes[6:8],
        t0 + 3 * m,
        t0 + 42 * m,
        1.0,
        per_rank_progress=True,
        slow_from=t0 + 15 * m,
        slow_rank=11,
        pauses=[(t0 + 30 * m, 60.0, "eval")],
    )
    cancel = Job("1005", nodes[8:9], t0 + 1 * m, t0 + 12 * m, 3.0, end_state="CANCELLED")
    for job in (steady, crash, hang, slow, cancel):
        sc.run_job(job)

    sc.sched_job(steady.end, steady, "COMPLETED", 0)
    sc.sched_job(slow.end, slow, "COMPLETED", 0)
    sc.sched_job(cancel.end + 2.0, cancel, "CANCELLED")
    for fault_id, category, onset, job_id in (
        ("benign-checkpoint", "checkpoint_pause", t0 + 15 * m, steady.job_id),
        ("benign-cancel", "user_cancel", cancel.end, cancel.job_id),
        ("benign-eval", "eval_pause", t0 + 30 * m, slow.job_id),
    ):
        sc.label(
            fault_id=fault_id,
            kind="benign",
            category=category,
            layer="application",
            onset_ts=onset,
            job_id=job_id,
            nodes=[],
            ranks=[],
        )

    # Crash: GPU 3 of gpu-node-04 falls off the bus; its ranks die, the others time out.
    tc = crash.stop_progress_at
    assert tc is not None
    bad_node = crash.nodes[1]
    sc.log(
        tc + 0.2,
        None,
        bad_node,
        None,
        "NVRM: Xid (PCI:0000:4b:00): 79, pid=4411, name=python, GPU has fallen off the bus.",
        source="kernel",
    )
    for r in range(8, 16):
        sc.log(
            tc + 0.6 + r * 0.01,
            crash.job_id,
            bad_node,
            r,
            f"[rank{r}]: RuntimeError: CUDA error: unspecified launch failure",
        )
    for r in range(0, 8):
        sc.log(
            tc + 60 + r * 0.01,
            crash.job_id,
            crash.nodes[0],
            r,
            f"[rank{r}]:[E1201 10:21:00.123456 ProcessGroupNCCL.cpp:607] [Rank {r}] Watchdog caught "
            "collective operation timeout: WorkNCCL(SeqNum=812, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, "
            "Timeout(ms)=60000) ran for 60007 milliseconds before timing out.",
        )
    sc.log(
        tc + 63,
        crash.job_id,
        crash.nodes[0],
        None,
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: failed (exitcode: -6) local_rank: 0",
    )
    sc.sched_job(tc + 65, crash, "FAILED", 1)
    sc.label(
        fault_id="f-crash",
        kind="crash",
        category="xid_79",
        layer="hardware",
        onset_ts=tc + 0.2,
        job_id=crash.job_id,
        nodes=[bad_node],
        ranks=[],
        gpus=[f"{bad_node}/3"],
    )

    # Hang: rank 13's dataloader deadlocks. Silence; its GPU idles while the others
    # spin in NCCL kernels; the NCCL watchdog speaks ten minutes later on every rank.
    th = hang.stop_progress_at
    assert th is not None
    for r in range(hang.ranks):
        sc.log(
            th + 600 + r * 0.01,
            hang.job_id,
            hang.node_of(r),
            r,
            f"[rank{r}]:[E1201 10:35:00.5 ProcessGroupNCCL.cpp:607] [Rank {r}] Watchdog caught collective "
            "operation timeout: WorkNCCL(SeqNum=5021, OpType=ALLREDUCE, Timeout(ms)=600000) ran for 600013 "
            "milliseconds before timing out.",
        )
    sc.sched_job(th + 605, hang, "FAILED", 1)
    sc.label(
        fault_id="f-hang",
        kind="hang",
        category="no_progress",
        layer="unknown",
        onset_ts=th,
        job_id=hang.job_id,
        nodes=[hang.node_of(13)],
        ranks=[13],
        gpus=[f"{hang.node_of(13)}/5"],
    )

    sc.label(
        fault_id="f-straggler",
        kind="straggler",
        category="slow_rank",
        layer="hardware",
        onset_ts=slow.slow_from,
        job_id=slow.job_id,
        nodes=[slow.node_of(11)],
        ranks=[11],
        gpus=[f"{slow.node_of(11)}/3"],
    )

    # An idle node whose GPU 2 starts failing: corrected ECC errors climb, then a row remap is pending.
    sc.label(
        fault_id="f-degraded",
        kind="node_unhealthy",
        category="ecc_sbe_burst",
        layer="hardware",
        onset_ts=t0 + 30 * m,
        job_id=None,
        nodes=[nodes[9]],
        ranks=[],
        gpus=[f"{nodes[9]}/2"],
    )
    # A driver reload on another idle node zeroes its counters: not an error.
    sc.label(
        fault_id="benign-counter-reset",
        kind="benign",
        category="counter_reset",
        layer="system",
        onset_ts=t0 + 35 * m,
        job_id=None,
        nodes=[nodes[10]],
        ranks=[],
    )

    busy = {n: (j.start, j.stop_progress_at or j.end) for j in (steady, crash, hang, slow, cancel) for n in j.nodes}
    sc.gpu_samples(
        nodes,
        busy,
        missing={(bad_node, 3): tc},
        slow_gpu={(slow.node_of(11), 3): slow.slow_from or 0},
        xids={(bad_node, 3): (tc - 5.0, 79)},
        hung={node: (th, th + 605, 5 if node == hang.node_of(13) else None) for node in hang.nodes},
        degrading={(nodes[9], 2): t0 + 30 * m},
        resets={nodes[10]: t0 + 35 * m},
    )
    return sc


def iter_labels(path: Path) -> Iterator[dict[str, Any]]:
    with path.open("rb") as fh:
        for line in fh:
            yield msgspec.json.decode(line)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    path = demo(args.seed).write(args.out)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
