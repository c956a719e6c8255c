"""Labelled cluster scenarios at any scale, generated as a time-ordered stream in bounded memory.

The cluster is simulated in chunks of event time: in each chunk every running job
emits its steps (per-framework iteration lines from rank 0, or per-rank progress
records), every node emits one NVML sample per GPU per interval, and faults
scheduled inside the chunk push their log lines and scheduler events (some of them
minutes in the future) onto a small heap. Whatever falls before the end of the
chunk is written out, so memory holds one chunk, not the scenario.

Physics (docs/architecture.md, "Failure physics"): ranks of a synchronous job share one step time; a slow GPU
raises every rank's step time and only its own compute time and metrics give it
away; a hang is silence, with the culprit GPU idle while its peers spin in NCCL
kernels, and the NCCL watchdog speaks ten minutes later; one crash makes every rank
print a cascade; counters are cumulative and reset on a driver reload; benign
pauses (checkpoints, evaluation, warm-up after a restart, user cancels) are common.

Each injected fault is written to ``labels.jsonl``: fault id, kind, category, layer,
onset, job, and the nodes/ranks/GPUs to blame. Benign confounders are labelled with
kind ``benign``.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from trainguard.datasets.records import (
    BASE_TS,
    GPUS_PER_NODE,
    gpu_sample,
    hung_profile,
    job_record,
    log_record,
    phase_profile,
    rfc3339,
    throttled_profile,
)

WATCHDOG_S = 600.0  # PyTorch's NCCL watchdog default

# --------------------------------------------------------------------------- faults
# name -> (kind, category, layer): what the label says a detector should report.
FAULTS: dict[str, tuple[str, str, str]] = {
    "xid79": ("crash", "xid_79", "hardware"),
    "xid48": ("crash", "xid_48", "hardware"),
    "xid94": ("crash", "xid_94", "hardware"),
    "xid95": ("crash", "xid_95", "hardware"),
    "row_remap_failure": ("crash", "xid_64", "hardware"),
    "nvlink": ("crash", "xid_74", "hardware"),
    "gsp": ("crash", "xid_119", "system"),
    "ib_link_flap": ("crash", "ib_link", "hardware"),
    # The kernel's OOM killer behind a NCCL cascade: the host's memory, a system-layer fault as
    # operators (and the real-log corpus) diagnose it.
    "hidden_root_cascade": ("crash", "host_oom", "system"),
    "illegal_address": ("crash", "cuda_illegal_address", "application"),
    "cuda_oom": ("crash", "oom", "application"),
    "nan_loss": ("numerics", "nan_loss", "application"),
    "hang_silent": ("hang", "no_progress", "unknown"),
    "hang_watchdog": ("hang", "no_progress", "unknown"),
    "thermal_straggler": ("straggler", "slow_rank", "hardware"),
    "slow_nic": ("straggler", "slow_nic", "hardware"),
    "degraded_idle_node": ("node_unhealthy", "ecc_sbe_burst", "hardware"),
    "lemon_node": ("crash", "cuda_launch_failure", "hardware"),
}
BENIGN = ("long_checkpoint", "eval_phase", "restart_warmup", "user_cancel", "counter_reset")
# Whether the right answer takes the node out of service: persistent hardware, or a fault whose
# remedy needs the node (a GSP timeout needs a GPU reset), but not a transient hardware fault
# (a contained ECC error, one IB port error): those are retried without quarantine.
TRANSIENT_HARDWARE = frozenset({"xid94", "ib_link_flap"})
# Stragglers are notified by the default policy (rules.straggler: notify): no drain expected.
NOTIFY_ONLY = frozenset({"thermal_straggler", "slow_nic"})
NODE_OUT = frozenset({"gsp"})

# Llama 3 405B pre-training, 54 days, 419 unexpected interruptions (Meta, 2024), mapped
# onto the fault catalogue above.
LLAMA3_MIX: dict[str, float] = {
    "xid79": 74,
    "xid48": 37,
    "thermal_straggler": 37,  # faulty GPU 148
    "xid94": 24,
    "xid95": 24,
    "row_remap_failure": 24,  # GPU HBM3 memory 72
    "illegal_address": 27,
    "cuda_oom": 14,
    "hang_silent": 13,  # software bug 54
    "ib_link_flap": 35,  # network switch/cable 35
    "lemon_node": 32,  # host maintenance 32: hosts that keep failing
    "nvlink": 19,  # GPU SRAM 19 (shown as NVLink/ECC Xids)
    "gsp": 17,  # GPU system processor 17
    "slow_nic": 7,  # NIC 7
    "hang_watchdog": 7,  # NCCL watchdog 7
    "nan_loss": 6,  # silent data corruption 6
    "hidden_root_cascade": 5,  # host OOM behind a NCCL cascade
}


@dataclass
class Fault:
    name: str
    at: float
    node_index: int = 0  # which node of the job (or of the idle pool)
    gpu: int = 0
    code: int = 0  # the Xid, for faults drawn from NVIDIA's catalog


# --------------------------------------------------------------------------- jobs
@dataclass
class JobSim:
    job_id: str
    nodes: list[str]
    start: float
    end: float
    step_s: float
    framework: str = "megatron"  # megatron | torchtitan | deepspeed | per_rank
    pauses: list[tuple[float, float, str]] = field(default_factory=list)
    # A rhythm of benign pauses at step multiples, as real jobs have: evaluations (no start
    # marker when ``eval_marker`` is off, as Megatron, torchtitan and DeepSpeed print none; GPUs
    # busy) and checkpoints (a save marker; GPUs idle). ``rhythm_printed``: the job printed its
    # intervals in an argument dump at start.
    eval_every: int = 0
    save_every: int = 0
    eval_s: tuple[float, float] = (30.0, 180.0)
    save_s: tuple[float, float] = (60.0, 240.0)
    eval_marker: bool = True
    rhythm_printed: bool = False
    phase: tuple[str, float] | None = None  # (eval | checkpoint, until): what the GPUs are doing
    fault: Fault | None = None
    fault_done: bool = False
    end_state: str = "COMPLETED"
    # state
    step: int = 0
    next_ts: float = 0.0
    stalled_at: float | None = None
    slow: tuple[float, int, float] | None = None  # (from, rank or -1 for a NIC, factor)
    idle_gpu: tuple[str, int] | None = None  # the hung culprit
    hot: dict[tuple[str, int], float] = field(default_factory=dict)
    nan_from: float | None = None
    ended: bool = False
    end_at: float = float("inf")

    @property
    def ranks(self) -> int:
        return len(self.nodes) * GPUS_PER_NODE

    def node_of(self, rank: int) -> str:
        return self.nodes[rank // GPUS_PER_NODE]


class Sink:
    """Time-ordered output: records at or before the flush horizon leave in timestamp order."""

    def __init__(self, write: Callable[[str, dict[str, Any]], None]) -> None:
        self._heap: list[tuple[float, int, str, dict[str, Any]]] = []
        self._seq = 0
        self._write = write

    def put(self, topic: str, ts: float, record: dict[str, Any]) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (ts, self._seq, topic, record))

    def flush(self, horizon: float) -> None:
        while self._heap and self._heap[0][0] < horizon:
            _ts, _seq, topic, record = heapq.heappop(self._heap)
            self._write(topic, record)


class ClusterSim:
    """The whole cluster: jobs, nodes, faults, labels."""

    def __init__(
        self,
        seed: int,
        nodes: int,
        duration_s: float,
        gpu_interval_s: float = 10.0,
        names: str = "gpu-node-{:04d}",
        t0: float = BASE_TS,
    ) -> None:
        self.rng = random.Random(seed)
        self.nodes = [names.format(i) for i in range(1, nodes + 1)]
        self.t0 = t0
        self.duration_s = duration_s
        self.gpu_interval_s = gpu_interval_s
        self.jobs: list[JobSim] = []
        self.labels: list[dict[str, Any]] = []
        self.node_job: dict[str, JobSim] = {}
        self.counters = {
            (n, g): [self.rng.randint(0, 40), 0, self.rng.randint(0, 5), self.rng.randint(0, 3)]
            for n in self.nodes
            for g in range(GPUS_PER_NODE)
        }
        self.degrading: dict[tuple[str, int], float] = {}
        self.resets: dict[str, float] = {}
        self.dbe_at: dict[tuple[str, int], float] = {}  # a double-bit error lands at this time
        # A GPU that fell off the bus stays gone after its job has failed, until somebody repairs the node.
        self.gone: dict[tuple[str, int], float] = {}
        self.later: list[tuple[float, str, str]] = []  # (ts, node, kernel line) not tied to a job's fault

    # -- labels -------------------------------------------------------------------
    def label(
        self,
        fault_id: str,
        name: str,
        onset: float,
        job: JobSim | None,
        nodes: list[str],
        ranks: list[int] | None = None,
        gpus: list[str] | None = None,
        verdict: tuple[str, str, str, bool] | None = None,
    ) -> None:
        """Label a fault (or a benign confounder); ``verdict`` = (kind, category, layer, drain) when
        the fault table does not say (an Xid drawn from NVIDIA's catalog)."""
        kind, category, layer = FAULTS.get(name, ("benign", name, "application"))
        drain = (layer == "hardware" and name not in TRANSIENT_HARDWARE | NOTIFY_ONLY) or name in NODE_OUT
        if verdict is not None:
            kind, category, layer, drain = verdict
        self.labels.append(
            {
                "fault_id": fault_id,
                "fault": name,
                "kind": kind,
                "category": category,
                "layer": layer,
                "drain": drain and bool(nodes),
                "onset_ts": rfc3339(onset),
                "job_id": job.job_id if job else None,
                "nodes": nodes,
                "ranks": ranks or [],
                "gpus": gpus or [],
            }
        )

    # -- records -----------------------------------------------------------------------
    def log(
        self, sink: Sink, ts: float, job: JobSim | None, node: str, rank: int | None, line: str, source: str = "app"
    ) -> None:
        sink.put("logs", ts, log_record(ts, job.job_id if job else None, node, rank, line, source))

    def sched(self, sink: Sink, ts: float, job: JobSim, state: str, exit_code: int | None = None) -> None:
        sink.put("scheduler", ts, job_record(ts, job.job_id, state, job.nodes, exit_code))

    def progress_line(self, job: JobSim, step: int, step_time: float, loss: str) -> str:
        if job.framework == "torchtitan":
            return (
                f"step: {step:>5}  loss: {loss}  memory: 41.20GiB(52.07%)  tps: {int(8192 / step_time):,}  mfu: 41.3%"
            )
        if job.framework == "deepspeed":
            return (
                f"[INFO] [timer.py:260:stop] epoch=0/micro_step={step * 4}/global_step={step}, "
                f"RunningAvgSamplesPerSec={256 / step_time:.2f}, CurrSamplesPerSec={256 / step_time:.2f}"
            )
        return (
            f"[default0]: iteration {step:>8}/  100000 | consumed samples: {step * 512:>10} | "
            f"elapsed time per iteration (ms): {step_time * 1000:.1f} | learning rate: 1.000E-04 | "
            f"global batch size:   512 | lm loss: {loss} | grad norm: 0.31 | number of nan iterations:   0 |"
        )

    # -- simulation -----------------------------------------------------------------------
    def start_job(self, sink: Sink, job: JobSim) -> None:
        for node in job.nodes:
            self.node_job[node] = job
        job.next_ts = job.start + 25.0 + self.rng.uniform(0, 10)  # launcher, imports, first compile
        self.sched(sink, job.start, job, "RUNNING")

    def end_job(self, sink: Sink, job: JobSim, ts: float, state: str, exit_code: int | None = None) -> None:
        """The job stops stepping now; the scheduler sees it end (and frees its nodes) at ``ts``."""
        if job.ended:
            return
        job.ended = True
        job.end_at = ts
        job.stalled_at = job.stalled_at or ts
        self.sched(sink, ts, job, state, exit_code)

    def advance_job(self, sink: Sink, job: JobSim, t1: float) -> None:
        rng = self.rng
        while not job.ended and job.stalled_at is None and job.next_ts < min(t1, job.end):
            ts = job.next_ts
            if job.fault is not None and job.fault.at <= ts and not job.fault_done:
                job.fault_done = True
                self.inject(sink, job, job.fault)
                if job.stalled_at is not None:
                    break
            if job.pauses and ts >= job.pauses[0][0]:
                _, seconds, phase = job.pauses.pop(0)
                job.phase = (phase, ts + seconds)
                if phase == "eval_silent":
                    self.log(
                        sink,
                        ts + seconds,
                        job,
                        job.nodes[0],
                        0,
                        f"[default0]:  validation loss at iteration {job.step} | lm loss value: 2.310E+00 | "
                        "lm loss PPL: 1.007E+01 |",
                    )
                elif phase == "checkpoint":
                    self.log(sink, ts, job, job.nodes[0], 0, f"[default0]: saving checkpoint at iteration {job.step}")
                    self.log(
                        sink,
                        ts + seconds,
                        job,
                        job.nodes[0],
                        0,
                        f"[default0]:   successfully saved checkpoint at iteration {job.step}",
                    )
                else:
                    self.log(sink, ts, job, job.nodes[0], 0, "[default0]: Running Evaluation")
                    self.log(sink, ts + seconds, job, job.nodes[0], 0, "[default0]: evaluation done")
                job.next_ts = ts + seconds
                continue
            compute = {r: job.step_s * 0.7 * rng.uniform(0.97, 1.03) for r in range(job.ranks)}
            comm = 0.3 * job.step_s
            if job.slow is not None and ts >= job.slow[0]:
                _frm, rank, factor = job.slow
                if rank >= 0:
                    compute[rank] *= factor
                else:
                    comm *= factor * 2.0  # a slow NIC stretches every collective
            step_time = (max(compute.values()) + comm) * rng.uniform(0.99, 1.01)
            if job.step < 3:
                step_time *= 3.0
            job.step += 1
            ts += step_time
            self.schedule_rhythm(job, ts)
            loss = "nan" if job.nan_from is not None and ts >= job.nan_from else f"{2.5 - job.step * 1e-4:.6E}"
            if job.framework == "per_rank":
                for r in range(job.ranks):
                    sink.put(
                        "progress",
                        ts,
                        {
                            "ts": round(ts + rng.uniform(0, 0.05), 4),
                            "job_id": job.job_id,
                            "node": job.node_of(r),
                            "rank": r,
                            "step": job.step,
                            "step_time_s": round(step_time, 4),
                            "compute_time_s": round(compute[r], 4),
                        },
                    )
                if loss == "nan":
                    self.log(
                        sink,
                        ts,
                        job,
                        job.nodes[0],
                        0,
                        f"[default0]: iteration {job.step} | lm loss: nan | grad norm: nan |",
                    )
            else:
                self.log(sink, ts, job, job.nodes[0], 0, self.progress_line(job, job.step, step_time, loss))
                if loss == "nan" and job.framework == "deepspeed":  # its timer lines carry no loss
                    self.log(
                        sink,
                        ts,
                        job,
                        job.nodes[0],
                        0,
                        f"[INFO] [logging.py:96:log_dist] [Rank 0] step={job.step}, skipped=0, loss=nan",
                    )
            job.next_ts = ts
        if not job.ended and job.stalled_at is None and job.next_ts >= job.end:
            self.end_job(sink, job, job.end, job.end_state, 0 if job.end_state == "COMPLETED" else None)

    def wording(self, fault: str, node: str) -> str:
        """The line a fault is announced by (presets that draw from real formats override this)."""
        return {
            "ib_link_flap": f"{node}:3468:3905 [4] NCCL WARN NET/IB : Got async event : port error",
            "hidden_root_cascade": "Out of memory: Killed process 7731 (python) total-vm:98765432kB",
            "illegal_address": "RuntimeError: CUDA error: an illegal memory access was encountered",
            "cuda_oom": "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
        }[fault]

    def adjust_sample(self, sample: dict[str, Any], job: JobSim | None, t: float) -> None:
        """A hook for presets that vary what exporters send (field types, noise); none here."""

    def schedule_rhythm(self, job: JobSim, ts: float) -> None:
        """After a step at a multiple of the job's intervals: its evaluation, then its checkpoint."""
        rng = self.rng
        if job.eval_every and job.step % job.eval_every == 0:
            kind = "eval" if job.eval_marker else "eval_silent"
            job.pauses.insert(0, (ts, rng.uniform(*job.eval_s), kind))
            self.label(f"b-{kind}-{job.job_id}-{job.step}", f"{kind}_phase", ts, job, [])
        if job.save_every and job.step % job.save_every == 0:
            self.label(f"b-checkpoint-{job.job_id}-{job.step}", "checkpoint_phase", ts, job, [])
            job.pauses.insert(
                1 if job.pauses and job.pauses[0][0] == ts else 0, (ts, rng.uniform(*job.save_s), "checkpoint")
            )

    @staticmethod
    def place(job: JobSim, fault: Fault) -> tuple[float, str, int, int, str]:
        """Where a fault strikes: ``(time, node, GPU, rank, label id)``."""
        index = fault.node_index % len(job.nodes)
        return fault.at, job.nodes[index], fault.gpu, index * GPUS_PER_NODE + fault.gpu, f"f-{fault.name}-{job.job_id}"

    def inject(self, sink: Sink, job: JobSim, fault: Fault) -> None:
        """Apply a fault to a running job at ``fault.at``: its records, its effects, its label."""
        t, node, g, rank, fid = self.place(job, fault)
        name = fault.name
        xids = {"xid79": 79, "xid48": 48, "xid94": 94, "xid95": 95, "row_remap_failure": 64, "nvlink": 74, "gsp": 119}
        if name in xids:
            code = xids[name]
            self.log(
                sink,
                t,
                None,
                node,
                None,
                f"NVRM: Xid (PCI:0000:{0x1B + g * 0x10:02x}:00): {code}, pid=4411, name=python",
                source="kernel",
            )
            if name == "xid79":
                self.gone[(node, g)] = t
                what = "CUDA error: unspecified launch failure"
            elif name in ("xid48", "xid95", "row_remap_failure"):
                what = "CUDA error: uncorrectable ECC error encountered"
                self.dbe_at[(node, g)] = t
            else:
                what = (
                    "CUDA error: an illegal memory access was encountered"
                    if name == "xid94"
                    else "CUDA error: unspecified launch failure"
                )
            self.crash_cascade(sink, job, t, node, what)
            self.label(fid, name, t, job, [node], [], [f"{node}/{g}"])
        elif name == "ib_link_flap":
            self.log(
                sink,
                t,
                None,
                node,
                None,
                self.wording("ib_link_flap", node=node),
                source="app",
            )
            self.crash_cascade(
                sink, job, t + 1.0, node, "NCCL error: remote process exited or there was a network error"
            )
            self.label(fid, name, t, job, [node])
        elif name == "hidden_root_cascade":
            self.log(
                sink,
                t,
                None,
                node,
                None,
                self.wording("hidden_root_cascade", node=node),
                source="kernel",
            )
            job.stalled_at = t
            for r in range(job.ranks):
                if job.node_of(r) != node:
                    self.log(sink, t + WATCHDOG_S + r * 0.01, job, job.node_of(r), r, self.watchdog_line(r, job.step))
            self.end_job(sink, job, t + WATCHDOG_S + 5, "FAILED", 1)
            self.label(fid, name, t, job, [node])
        elif name in ("illegal_address", "cuda_oom"):
            what = (
                self.wording("illegal_address", node=node)
                if name == "illegal_address"
                else self.wording("cuda_oom", node=node)
            )
            self.log(sink, t, job, node, rank, f"[rank{rank}]: {what}")
            self.crash_cascade(sink, job, t + 0.5, node, what, log_root=False)
            self.label(fid, name, t, job, [node], [rank])
        elif name == "lemon_node":
            self.log(sink, t, job, node, rank, f"[rank{rank}]: RuntimeError: CUDA error: unspecified launch failure")
            self.crash_cascade(sink, job, t + 0.5, node, "", log_root=False)
            self.label(fid, name, t, job, [node], [rank])
        elif name == "nan_loss":
            job.nan_from = t
            self.label(fid, name, t, job, [])
        elif name in ("hang_silent", "hang_watchdog"):
            job.stalled_at = t
            job.idle_gpu = (node, g)
            if name == "hang_watchdog":
                for r in range(job.ranks):
                    self.log(sink, t + WATCHDOG_S + r * 0.01, job, job.node_of(r), r, self.watchdog_line(r, job.step))
                self.end_job(sink, job, t + WATCHDOG_S + 5, "FAILED", 1)
            else:
                self.end_job(sink, job, t + 1500, "CANCELLED")  # somebody notices, eventually
            self.label(fid, name, t, job, [node], [rank], [f"{node}/{g}"])
        elif name == "thermal_straggler":
            job.slow = (t, rank, 1.6)
            job.hot[(node, g)] = t
            self.label(fid, name, t, job, [node], [rank], [f"{node}/{g}"])
        elif name == "slow_nic":
            # The NIC trains down to a quarter of its speed; the kernel says so once.
            job.slow = (t, -1, 1.8)
            self.log(
                sink,
                t,
                None,
                node,
                None,
                f"mlx5_core 0000:{0x5E + g:02x}:00.0: Port 1 link speed degraded: 400000 Mb/s -> 100000 Mb/s",
                source="kernel",
            )
            self.label(fid, name, t, job, [node])
        else:
            raise ValueError(f"fault {name!r} cannot be injected into a job")

    def watchdog_line(self, rank: int, step: int) -> str:
        return (
            f"[rank{rank}]:[E1201 10:35:00.5 ProcessGroupNCCL.cpp:607] [Rank {rank}] Watchdog caught collective "
            f"operation timeout: WorkNCCL(SeqNum={step * 4}, OpType=ALLREDUCE, Timeout(ms)=600000) ran for "
            "600013 milliseconds before timing out."
        )

    def crash_cascade(self, sink: Sink, job: JobSim, t: float, node: str, what: str, log_root: bool = True) -> None:
        """The ranks of ``node`` print ``what``; the others time out; torchrun gives up; the job fails."""
        job.stalled_at = t
        for r in range(job.ranks):
            if job.node_of(r) == node and log_root and what:
                self.log(sink, t + 0.5 + r * 0.01, job, node, r, f"[rank{r}]: RuntimeError: {what}")
        for r in range(job.ranks):
            if job.node_of(r) != node:
                self.log(sink, t + 30 + r * 0.01, job, job.node_of(r), r, self.watchdog_line(r, job.step))
        self.log(
            sink,
            t + 32,
            job,
            job.nodes[0],
            None,
            "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: failed (exitcode: 1) local_rank: 0",
        )
        self.end_job(sink, job, t + 35, "FAILED", 1)

    def gpu_samples(self, sink: Sink, t0: float, t1: float) -> None:
        rng = self.rng
        t = t0
        while t < t1:
            for node in self.nodes:
                job = self.node_job.get(node)
                if job is not None and t >= job.end_at:
                    del self.node_job[node]  # the scheduler has released the node
                    job = None
                running = job is not None and job.start <= t and (job.stalled_at is None or job.idle_gpu)
                sweep_ts = None  # a node's GPUs are read in one sweep (NVML, a dcgm-exporter scrape): one timestamp
                for g in range(GPUS_PER_NODE):
                    if (node, g) in self.gone and t >= self.gone[(node, g)]:
                        continue
                    c = self.counters[(node, g)]
                    if node in self.resets and t >= self.resets[node]:
                        c[:] = [0, 0, 0, 0]
                    if rng.random() < 0.01:
                        c[0] += 1
                    dbe = self.dbe_at.get((node, g))
                    if dbe is not None and t >= dbe:
                        c[1] += 1
                        del self.dbe_at[(node, g)]
                    since = self.degrading.get((node, g))
                    if since is not None and t >= since:
                        c[0] += rng.randint(15, 30)
                    busy = running and job is not None and job.stalled_at is None
                    sample = gpu_sample(rng, t, node, g, c, busy)
                    sweep_ts = sample["ts"] = sample["ts"] if sweep_ts is None else sweep_ts
                    if job is not None and job.idle_gpu is not None and job.stalled_at is not None and running:
                        spinning = (node, g) != job.idle_gpu
                        sample.update(hung_profile(rng, spinning))
                    if busy and job is not None and job.phase is not None and t < job.phase[1]:
                        sample.update(phase_profile(rng, job.phase[0]))
                    computing = busy and sample["util_pct"] > 50.0  # a hot GPU throttles under load, not idle
                    if computing and job is not None and (node, g) in job.hot and t >= job.hot[(node, g)]:
                        sample.update(throttled_profile(rng))
                    self.adjust_sample(sample, job, t)
                    sink.put("gpu", sample["ts"], sample)
            for node in [n for n, when in self.resets.items() if t >= when]:
                del self.resets[node]
            t += self.gpu_interval_s


# --------------------------------------------------------------------------- presets
def _plan(sim: ClusterSim, faults: list[str], jobs: int, nodes_per_job: int, benign: bool) -> None:
    """Lay out jobs over the cluster and assign faults and confounders to them."""
    rng = sim.rng
    d = sim.duration_s
    t0 = sim.t0
    free = list(sim.nodes)
    rng.shuffle(free)
    idle_pool = free[jobs * nodes_per_job :]
    frameworks = ("megatron", "per_rank", "torchtitan", "deepspeed")
    job_faults = [f for f in faults if f != "degraded_idle_node"]
    for j in range(jobs):
        nodes = free[j * nodes_per_job : (j + 1) * nodes_per_job]
        start = t0 + rng.uniform(0, 0.1) * d
        end = t0 + d * rng.uniform(0.85, 1.0)
        framework = frameworks[j % len(frameworks)]
        if j < len(job_faults) and job_faults[j] in ("thermal_straggler", "slow_nic"):
            framework = "per_rank"  # rank timings to localise by
        job = JobSim(str(20_000 + j), nodes, start, end, step_s=rng.choice((1.0, 1.5, 2.0, 3.0)), framework=framework)
        if j < len(job_faults):
            name = job_faults[j]
            at = t0 + d * rng.uniform(0.3, 0.6)
            if name == "lemon_node" and len(idle_pool) >= 2 * (nodes_per_job - 1) + 1:
                # A lemon node fails a job, then each next job placed on it: three failures, three jobs.
                lemon = idle_pool.pop(0)
                job.nodes = [lemon, *nodes[1:]]
                at = t0 + d * rng.uniform(0.1, 0.2)
                job.fault = Fault(name, at, node_index=0, gpu=rng.randrange(GPUS_PER_NODE))
                for k in (1, 2):
                    start = at + k * d * 0.25
                    follower = JobSim(
                        str(30_000 + 100 * k + j),
                        [lemon, *[idle_pool.pop(0) for _ in range(nodes_per_job - 1)]],
                        start,
                        end,
                        step_s=job.step_s,
                        framework="megatron",
                    )
                    follower.fault = Fault(name, start + d * 0.1, node_index=0, gpu=rng.randrange(GPUS_PER_NODE))
                    sim.jobs.append(follower)
            elif name == "lemon_node":
                job.fault = Fault("illegal_address", at, node_index=0)  # no spare node for a lemon here
            else:
                job.fault = Fault(name, at, node_index=rng.randrange(nodes_per_job), gpu=rng.randrange(GPUS_PER_NODE))
        elif benign:
            kind = BENIGN[(j - len(job_faults)) % len(BENIGN)]
            at = t0 + d * rng.uniform(0.3, 0.6)
            if kind == "long_checkpoint":
                job.pauses.append((at, rng.uniform(240, 480), "checkpoint"))
            elif kind == "eval_phase":
                job.pauses.append((at, rng.uniform(60, 180), "eval"))
            elif kind == "user_cancel":
                job.end, job.end_state = at, "CANCELLED"
            elif kind == "restart_warmup":
                job.start = at  # starts late: its warm-up is inside the window
            elif kind == "counter_reset" and idle_pool:
                sim.resets[idle_pool[-1]] = at
                sim.label(f"b-{kind}-{j}", kind, at, None, [idle_pool[-1]])
                sim.jobs.append(job)
                continue
            sim.label(f"b-{kind}-{job.job_id}", kind, at, job, [])
        sim.jobs.append(job)
    for name in faults:
        if name == "degraded_idle_node" and idle_pool:
            node = idle_pool.pop(0)
            g = rng.randrange(GPUS_PER_NODE)
            at = t0 + d * rng.uniform(0.3, 0.6)
            sim.degrading[(node, g)] = at
            sim.label(f"f-degraded-{node}", name, at, None, [node], [], [f"{node}/{g}"])


def build_demo(seed: int = 0) -> ClusterSim:
    """The bundled demo: five jobs on twelve nodes for 45 minutes — a GPU falls off the bus, a
    dataloader deadlocks, a GPU runs hot — beside a checkpoint, an evaluation, a user's cancel, a
    degrading idle GPU and a driver reload that zeroes a node's counters.

    >>> sim = build_demo()
    >>> [(job.job_id, job.fault.name if job.fault else None) for job in sim.jobs]
    [('1001', None), ('1002', 'xid79'), ('1003', 'hang_watchdog'), ('1004', 'thermal_straggler'), ('1005', None)]
    """
    sim = ClusterSim(seed, 12, 45 * 60, names="gpu-node-{:02d}")
    m, t0, n = 60.0, sim.t0, sim.nodes
    steady = JobSim("1001", n[0:2], t0 + 1 * m, t0 + 40 * m, 2.0, pauses=[(t0 + 15 * m, 150.0, "checkpoint")])
    crash = JobSim("1002", n[2:4], t0 + 2 * m, t0 + 45 * m, 1.5, fault=Fault("xid79", t0 + 20 * m, 1, gpu=3))
    hang = JobSim("1003", n[4:6], t0 + 2 * m, t0 + 45 * m, 2.5, fault=Fault("hang_watchdog", t0 + 25 * m, 1, gpu=5))
    slow = JobSim(
        "1004",
        n[6:8],
        t0 + 3 * m,
        t0 + 42 * m,
        1.0,
        framework="per_rank",
        pauses=[(t0 + 30 * m, 60.0, "eval")],
        fault=Fault("thermal_straggler", t0 + 15 * m, 1, gpu=3),
    )
    cancel = JobSim("1005", n[8:9], t0 + 1 * m, t0 + 12 * m, 3.0, end_state="CANCELLED")
    sim.jobs += [steady, crash, hang, slow, cancel]
    sim.label("benign-checkpoint", "long_checkpoint", t0 + 15 * m, steady, [])
    sim.label("benign-eval", "eval_phase", t0 + 30 * m, slow, [])
    sim.label("benign-cancel", "user_cancel", cancel.end, cancel, [])
    sim.degrading[(n[9], 2)] = t0 + 30 * m
    sim.label(f"f-degraded-{n[9]}", "degraded_idle_node", t0 + 30 * m, None, [n[9]], [], [f"{n[9]}/2"])
    sim.resets[n[10]] = t0 + 35 * m
    sim.label("benign-counter-reset", "counter_reset", t0 + 35 * m, None, [n[10]])
    return sim


MIXES = ("gpu", "progress", "logs")


def build_mix(seed: int, jobs: int, minutes: float, emphasis: str | None = None) -> ClusterSim:
    """A throughput workload: ``jobs`` two-node jobs, half logging Megatron lines from rank 0 and half
    sending per-rank progress; every fourth hangs, every fourth straggles, all checkpoint once.

    ``emphasis`` tilts the mix towards one kind of record (the same jobs and faults): ``gpu`` —
    GPU samples every 2 s, steps half as often (~80 % GPU samples); ``progress`` — every job
    sends per-rank progress (~80 %); ``logs`` — every job logs Megatron lines, eight steps a second.

    >>> sim = build_mix(1, jobs=4, minutes=10)
    >>> [(job.framework, job.fault.name if job.fault else None) for job in sim.jobs]
    [('megatron', None), ('per_rank', None), ('megatron', 'hang_silent'), ('per_rank', 'thermal_straggler')]
    """
    if emphasis not in (None, *MIXES):
        raise ValueError(f"unknown mix {emphasis!r}; use one of {', '.join(MIXES)}.")
    interval = 2.0 if emphasis == "gpu" else 10.0
    sim = ClusterSim(seed, 2 * jobs, minutes * 60, gpu_interval_s=interval, names="node-{:04d}")
    t0, d = sim.t0, minutes * 60
    step_scale = {"gpu": 2.0, "logs": 0.125}.get(emphasis or "", 1.0)
    for j in range(jobs):
        framework = "per_rank" if j % 2 else "megatron"
        if emphasis == "progress":
            framework = "per_rank"
        elif emphasis == "logs":
            framework = "megatron"
        job = JobSim(
            str(10_000 + j),
            sim.nodes[2 * j : 2 * j + 2],
            t0 + 30,
            t0 + d - 30,
            step_s=(1.0 + (j % 3) * 0.5) * step_scale,
            framework=framework,
            pauses=[(t0 + d * 2 / 3, 90.0, "checkpoint")],
        )
        if j % 4 == 2:
            job.fault = Fault("hang_silent", t0 + d / 2, node_index=1, gpu=2)
        elif j % 4 == 3:
            job.fault = Fault("thermal_straggler", t0 + d / 3, node_index=0, gpu=3)
        sim.jobs.append(job)
    return sim


PRESETS = ("demo", "default", "llama3", "scale", "adversarial", "mix")


def build(
    preset: str, seed: int, nodes: int | None = None, minutes: float | None = None, mix: str | None = None
) -> ClusterSim:
    """A planned simulation for a preset: ``demo``, ``default``, ``llama3``, ``scale``, ``adversarial`` or ``mix``
    (``mix``: the ``mix`` preset's emphasis, see :func:`build_mix`)."""
    rng = random.Random(seed)
    if preset == "demo":
        if nodes is not None or minutes is not None:
            raise ValueError("the demo preset is fixed (twelve nodes, 45 minutes); drop --nodes and --minutes.")
        return build_demo(seed)
    if preset == "mix":
        return build_mix(seed, jobs=(nodes or 32) // 2, minutes=minutes or 30, emphasis=mix)
    if preset == "adversarial":
        from trainguard.datasets.adversarial import build_adversarial

        return build_adversarial(seed, nodes, minutes)
    if preset == "default":
        sim = ClusterSim(seed, nodes or 96, (minutes or 60) * 60)
        faults = list(FAULTS)
        _plan(sim, faults, jobs=len(faults) - 1 + len(BENIGN) * 2, nodes_per_job=2, benign=True)
    elif preset == "llama3":
        sim = ClusterSim(seed, nodes or 128, (minutes or 60) * 60)
        names = list(LLAMA3_MIX)
        faults = rng.choices(names, weights=[LLAMA3_MIX[n] for n in names], k=24)
        _plan(sim, [*faults, "degraded_idle_node"], jobs=40, nodes_per_job=2, benign=True)
    elif preset == "scale":
        sim = ClusterSim(seed, nodes or 1250, (minutes or 60) * 60)
        names = list(LLAMA3_MIX)
        faults = rng.choices(names, weights=[LLAMA3_MIX[n] for n in names], k=30)
        _plan(sim, faults, jobs=(nodes or 1250) // 8, nodes_per_job=8, benign=True)
    else:
        raise ValueError(f"unknown preset {preset!r}; the presets are: {', '.join(PRESETS)}.")
    return sim


def stream(sim: ClusterSim, chunk_s: float = 60.0) -> Iterator[tuple[str, dict[str, Any]]]:
    """The scenario's records as ``(topic, record)`` in timestamp order, one chunk at a time."""
    out: list[tuple[str, dict[str, Any]]] = []
    sink = Sink(lambda topic, record: out.append((topic, record)))
    pending = sorted(sim.jobs, key=lambda j: j.start)
    running: list[JobSim] = []
    t = sim.t0
    end = sim.t0 + sim.duration_s
    while t < end:
        t1 = min(t + chunk_s, end)
        while pending and pending[0].start < t1:
            job = pending.pop(0)
            sim.start_job(sink, job)
            running.append(job)
        for ts, node, line in [x for x in sim.later if x[0] < t1]:
            sim.log(sink, ts, None, node, None, line, source="kernel")
        sim.later = [x for x in sim.later if x[0] >= t1]
        for job in running:
            sim.advance_job(sink, job, t1)
        running = [j for j in running if not j.ended]
        sim.gpu_samples(sink, t, t1)
        sink.flush(t1)
        yield from out
        out.clear()
        t = t1
    sink.flush(float("inf"))
    yield from out


_SCHEMAS = {
    "logs": [
        ("ts", "string"),
        ("job_id", "string"),
        ("node", "string"),
        ("rank", "int64"),
        ("source", "string"),
        ("line", "string"),
    ],
    "progress": [
        ("ts", "float64"),
        ("job_id", "string"),
        ("node", "string"),
        ("rank", "int64"),
        ("step", "int64"),
        ("step_time_s", "float64"),
        ("compute_time_s", "float64"),
    ],
    "gpu": [
        ("ts", "float64"),
        ("node", "string"),
        ("gpu", "int64"),
        ("util_pct", "float64"),
        ("mem_used_mib", "float64"),
        ("temp_c", "float64"),
        ("power_w", "float64"),
        ("sm_clock_mhz", "float64"),
        ("ecc_sbe_total", "int64"),
        ("ecc_dbe_total", "int64"),
        ("pcie_replay_total", "int64"),
        ("nvlink_crc_total", "int64"),
        ("throttle_reasons", "int64"),
        ("xid", "int64"),
        ("remapped_rows_pending", "int64"),
    ],
    "scheduler": [
        ("ts", "string"),
        ("kind", "string"),
        ("job_id", "string"),
        ("state", "string"),
        ("nodes", "list<string>"),
        ("ranks_per_node", "int64"),
        ("exit_code", "int64"),
    ],
}


class _Writers:
    """Per-topic JSON Lines files, or Parquet files written one row group per 50,000 records."""

    def __init__(self, out: Path, fmt: str) -> None:
        out.mkdir(parents=True, exist_ok=True)
        self.out = out
        self.fmt = fmt
        self.enc = msgspec.json.Encoder()
        self.counts = dict.fromkeys(_SCHEMAS, 0)
        self.files = {t: (out / f"{t}.jsonl").open("wb") for t in _SCHEMAS} if fmt == "jsonl" else {}
        self.buffers: dict[str, list[dict[str, Any]]] = {t: [] for t in _SCHEMAS}
        self.parquet: dict[str, Any] = {}

    def write(self, topic: str, record: dict[str, Any]) -> None:
        self.counts[topic] += 1
        if self.fmt == "jsonl":
            self.files[topic].write(self.enc.encode(record) + b"\n")
            return
        self.buffers[topic].append(record)
        if len(self.buffers[topic]) >= 50_000:
            self._flush(topic)

    def _flush(self, topic: str) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        rows = self.buffers[topic]
        if not rows:
            return
        types = {
            "string": pa.string(),
            "int64": pa.int64(),
            "float64": pa.float64(),
            "list<string>": pa.list_(pa.string()),
        }
        schema = pa.schema([(name, types[kind]) for name, kind in _SCHEMAS[topic]])
        if topic not in self.parquet:
            self.parquet[topic] = pq.ParquetWriter(self.out / f"{topic}.parquet", schema, compression="zstd")
        self.parquet[topic].write_table(pa.Table.from_pylist(rows, schema=schema))
        rows.clear()

    def close(self) -> None:
        for fh in self.files.values():
            fh.close()
        for topic in self.buffers:
            self._flush(topic)
        for writer in self.parquet.values():
            writer.close()


def write_scenario(
    preset: str,
    seed: int,
    out: Path,
    nodes: int | None = None,
    minutes: float | None = None,
    fmt: str = "jsonl",
    mix: str | None = None,
) -> dict[str, int]:
    """Generate a preset into a replay directory (JSON Lines or Parquet, plus labels.jsonl).

    Returns the records written per topic.
    """
    if fmt not in ("jsonl", "parquet"):
        raise ValueError(f"unknown format {fmt!r}; use jsonl or parquet.")
    sim = build(preset, seed, nodes, minutes, mix)
    writers = _Writers(out, fmt)
    try:
        for topic, record in stream(sim):
            writers.write(topic, record)
    finally:
        writers.close()
    write_labels(sim, out)
    return writers.counts


def write_labels(sim: ClusterSim, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    enc = msgspec.json.Encoder()
    with (out / "labels.jsonl").open("wb") as fh:
        fh.writelines(enc.encode(label) + b"\n" for label in sorted(sim.labels, key=lambda x: x["onset_ts"]))
