"""The ``adversarial`` preset: scenarios written against our detectors' blind spots, not for them.

Our other presets print a start marker for every evaluation and checkpoint; real
Megatron, torchtitan and DeepSpeed print nothing when an evaluation starts. Here,
on 12 jobs × 4 nodes (+ idle nodes) for 80 minutes, everything that made our own
numbers look better than independent scenarios is randomised:

- **benign rhythm**: every job evaluates every N steps without a start marker
  (GPUs keep computing, 0.5–3 min; Megatron's ``validation loss`` line after) and
  checkpoints every M steps (1–4 min, idle GPUs, a save marker before); the
  intervals appear in an argument dump at start only sometimes;
- **faults after pauses**: eight faults per scenario land after a job's first pauses
  (a false-alarm-prone pause followed by a real fault in the same job): hangs with
  an idle culprit or with every GPU spinning, Xids drawn from NVIDIA's catalog
  (labelled with NVIDIA's resolution: layer, and whether the node must go), IB
  port flaps that recover (retried, never drained) or repeat on a node within the
  hour (drained the second time), device-side asserts as kernels print them,
  illegal addresses, OOMs, NaN losses, a thermal straggler;
- **formats**: the NCCL watchdog lines of three PyTorch generations;
- **exporters**: some send ``remapped_rows_pending`` as a boolean, numbers as
  strings, ``"NaN"`` for an unreadable power sensor; idle GPUs' temperature and
  power are noisy and drift slowly.

Benign pauses and Xids NVIDIA says to ignore are labelled ``benign``: an alarm on
one is a false alarm (``benign_alarms`` in the score).
"""

from __future__ import annotations

import math
import random
from typing import Any

from trainguard.datasets.generator import BASE_TS, GPUS_PER_NODE, ClusterSim, Fault, JobSim, Sink
from trainguard.detectors.xid import catalog

SCENARIO_NODES = 56
JOBS = 12
NODES_PER_JOB = 4
MINUTES = 80.0
# Always two hangs (the latency that matters most), then six drawn from the rest.
ALWAYS = ("hang_silent", "hang_spin")
DRAWN = (
    "xid_catalog",
    "xid_catalog",
    "ib_link_flap",
    "ib_flap_repeat",
    "device_assert",
    "illegal_address",
    "cuda_oom",
    "nan_loss",
    "thermal_straggler",
    "hang_watchdog",
    "hidden_root_cascade",
)
ADVERSARIAL_FAULTS: dict[str, tuple[str, str, str]] = {
    "hang_spin": ("hang", "no_progress", "unknown"),
    "device_assert": ("crash", "cuda_device_assert", "application"),
    "ib_flap_repeat": ("crash", "ib_link", "hardware"),
}
# The NCCL watchdog as three PyTorch generations print it.
WATCHDOG_FORMATS = (
    "[E ProcessGroupNCCL.cpp:737] [Rank {r}] Watchdog caught collective operation timeout: WorkNCCL(SeqNum={seq}, "
    "OpType=ALLREDUCE, Timeout(ms)=1800000) ran for 1802212 milliseconds before timing out.",
    "[rank{r}]:[E1201 10:35:00.500000000 ProcessGroupNCCL.cpp:632] [Rank {r}] Watchdog caught collective operation "
    "timeout: WorkNCCL(SeqNum={seq}, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600013 "
    "milliseconds before timing out.",
    "[rank{r}]:[E1201 10:35:00.500000000 ProcessGroupNCCL.cpp:1895] [PG ID 0 PG GUID 0(default_pg) Rank {r}] "
    "Process group watchdog thread terminated with exception: [Rank {r}] Watchdog caught collective operation "
    "timeout: WorkNCCL(SeqNum={seq}, OpType=_ALLGATHER_BASE, NumelIn=8, NumelOut=64, Timeout(ms)=600000) ran for "
    "600020 milliseconds before timing out.",
)


# Each fault announced in several real formats (message texts as NCCL, PyTorch, XLA, UCX and
# the kernel print them), so the scenarios do not mirror one regex each.
WORDINGS: dict[str, tuple[str, ...]] = {
    "ib_link_flap": (
        "{node}:3468:3905 [4] NCCL WARN NET/IB : Got async event : port error",
        "{node}:3468:3905 [4] transport/net_ib.cc:1295 NCCL WARN NET/IB : Got completion from peer 10.0.4.17<53249> "
        "with status=12 opcode=0 len=0 vendor err 129 (Recv)",
        "[{node}:3468:0:3468] ib_mlx5_log.c:177  Transport retry count exceeded on mlx5_0:1/IB (synd 0x15 vend 0x81 "
        "hw_synd 0/0)",
    ),
    "hidden_root_cascade": (
        "Out of memory: Killed process 7731 (python) total-vm:98765432kB, anon-rss:91234567kB",
        "Memory cgroup out of memory: Killed process 7731 (python) total-vm:98765432kB",
        "slurmstepd: error: Detected 1 oom-kill event(s) in StepId=4242.0. Some of your processes may have been "
        "killed by the cgroup out-of-memory handler.",
    ),
    "illegal_address": (
        "RuntimeError: CUDA error: an illegal memory access was encountered",
        "torch.AcceleratorError: CUDA error: an illegal memory access was encountered",
        "RuntimeError: CUDA error: misaligned address",
    ),
    "cuda_oom": (
        "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.50 GiB. GPU 3 has a total capacity of "
        "79.10 GiB of which 1.02 GiB is free.",
        "jaxlib.xla_extension.XlaRuntimeError: RESOURCE_EXHAUSTED: Out of memory while trying to allocate "
        "2147483648 bytes.",
    ),
}


def _actionable_xids() -> list[int]:
    """Codes a fault can be drawn from: NVIDIA documents a response, and it is not a follow-up of another Xid."""
    return sorted(
        code
        for code, info in catalog().items()
        if not info.evidence_only and not info.cascade and info.description != "Unused"
    )


def _ignored_xids() -> list[int]:
    return sorted(
        code for code, info in catalog().items() if info.immediate == "IGNORE" and info.description != "Unused"
    )


class AdversarialSim(ClusterSim):
    """The cluster simulation with real-world rhythms, formats and exporters."""

    def __init__(self, seed: int, nodes: int, duration_s: float) -> None:
        super().__init__(seed, nodes, duration_s)
        self.odd_exporter = {n: self.rng.random() < 0.5 for n in self.nodes}
        self.idle_drift = {n: self.rng.uniform(-2.0, 2.0) for n in self.nodes}  # °C over the scenario

    # -- formats ------------------------------------------------------------------------
    def watchdog_line(self, rank: int, step: int) -> str:
        fmt = WATCHDOG_FORMATS[self.rng.randrange(len(WATCHDOG_FORMATS))]
        return fmt.format(r=rank, seq=step * 4)

    def start_job(self, sink: Sink, job: JobSim) -> None:
        super().start_job(sink, job)
        if job.rhythm_printed:
            lines = ["------------------------ arguments ------------------------"]
            lines += [f"  eval_interval ................................... {job.eval_every}"]
            lines += [f"  save_interval ................................... {job.save_every}"]
            lines += ["  log_interval .................................... 1"]
            for i, line in enumerate(lines):
                self.log(sink, job.start + 5.0 + i * 0.001, job, job.nodes[0], 0, f"[default0]: {line}")

    def wording(self, fault: str, node: str) -> str:
        choices = WORDINGS[fault]
        return choices[self.rng.randrange(len(choices))].format(node=node)

    # -- exporters -----------------------------------------------------------------------
    def adjust_sample(self, sample: dict[str, Any], job: JobSim | None, t: float) -> None:
        rng = self.rng
        node = sample["node"]
        if (sample["util_pct"] or 0.0) < 5.0:
            # Idle GPUs are not still: sensor noise and a slow drift of the room.
            frac = (t - self.t0) / self.duration_s
            sample["temp_c"] = round(sample["temp_c"] + self.idle_drift[node] * frac + rng.gauss(0, 0.8), 1)
            sample["power_w"] = round(sample["power_w"] + 3.0 * math.sin(frac * 6.0) + rng.gauss(0, 2.0), 1)
        if not self.odd_exporter[node]:
            return
        sample["remapped_rows_pending"] = False  # NVML reports pending remaps as a flag
        if rng.random() < 0.3:
            sample["util_pct"] = f"{sample['util_pct']:.1f}"  # a text-first exporter
        if rng.random() < 0.02:
            sample["power_w"] = "NaN"  # an unreadable power sensor

    # -- faults ----------------------------------------------------------------------------
    def inject(self, sink: Sink, job: JobSim, fault: Fault) -> None:
        t, node, g, rank, fid = self.place(job, fault)
        if fault.name == "xid_catalog":
            info = catalog()[fault.code]
            line = (
                f"NVRM: Xid (PCI:0000:{0x1B + g * 0x10:02x}:00): {fault.code}, pid=4411, name=python, {info.mnemonic}"
            )
            self.log(sink, t, None, node, None, line, source="kernel")
            what = "CUDA error: an illegal memory access was encountered" if info.layer == "application" else ""
            self.crash_cascade(sink, job, t + 0.5, node, what or "CUDA error: unspecified launch failure")
            verdict = ("crash", f"xid_{fault.code}", info.layer, info.drains)
            self.label(fid, fault.name, t, job, [node], [], [f"{node}/{g}"], verdict=verdict)
        elif fault.name == "hang_spin":
            # A deadlock in the collectives: every GPU spins in NCCL, none idles.
            job.stalled_at = t
            job.idle_gpu = ("", -1)
            self.end_job(sink, job, t + 1500, "CANCELLED")
            self.label(fid, fault.name, t, job, [], verdict=("hang", "no_progress", "unknown", False))
        elif fault.name == "device_assert":
            for thread in range(32, 36):
                self.log(
                    sink,
                    t + thread * 0.001,
                    job,
                    node,
                    rank,
                    "../aten/src/ATen/native/cuda/Indexing.cu:1284: indexSelectLargeIndex: block: [57,0,0], "
                    f"thread: [{thread},0,0] Assertion `srcIndex < srcSelectDimSize` failed.",
                )
            self.crash_cascade(sink, job, t + 0.5, node, "CUDA error: device-side assert triggered")
            self.label(
                fid, fault.name, t, job, [node], [rank], verdict=("crash", "cuda_device_assert", "application", False)
            )
        elif fault.name == "ib_flap_repeat":
            # The same node's port flapped in an earlier job within the hour: this time it must go.
            self.log(sink, t, None, node, None, f"{node}:3468:3905 [4] NCCL WARN NET/IB : Got async event : port error")
            self.crash_cascade(
                sink, job, t + 1.0, node, "NCCL error: remote process exited or there was a network error"
            )
            self.label(fid, fault.name, t, job, [node], verdict=("crash", "ib_link", "hardware", True))
        else:
            super().inject(sink, job, fault)


def build_adversarial(seed: int, nodes: int | None = None, minutes: float | None = None) -> AdversarialSim:
    """Plan an adversarial scenario (see the module notes)."""
    sim = AdversarialSim(seed, nodes or SCENARIO_NODES, (minutes or MINUTES) * 60)
    rng: random.Random = sim.rng
    d = sim.duration_s
    free = list(sim.nodes)
    rng.shuffle(free)
    jobs = min(JOBS, len(free) // NODES_PER_JOB)
    idle_pool = free[jobs * NODES_PER_JOB :]
    faults = [*ALWAYS, *rng.sample(DRAWN, 6)]
    rng.shuffle(faults)
    actionable = _actionable_xids()
    frameworks = ("megatron", "per_rank", "megatron", "torchtitan", "deepspeed")
    for j in range(jobs):
        nodes = free[j * NODES_PER_JOB : (j + 1) * NODES_PER_JOB]
        step_s = rng.uniform(1.0, 2.5)
        job = JobSim(
            str(40_000 + j),
            nodes,
            BASE_TS + rng.uniform(0, 0.05) * d,
            BASE_TS + d * rng.uniform(0.9, 1.0),
            step_s=step_s,
            framework=frameworks[j % len(frameworks)],
            eval_every=rng.choice((100, 200, 250)),
            save_every=rng.choice((300, 500, 600)),
            eval_marker=rng.random() < 0.2,
            rhythm_printed=rng.random() < 0.5,
        )
        if j < len(faults):
            name = faults[j]
            # After the job's first benign pauses: the false-alarm-prone pause, then the real fault.
            at = BASE_TS + d * rng.uniform(0.45, 0.75)
            if name == "thermal_straggler":
                job.framework = "per_rank"
            fault = Fault(name, at, node_index=rng.randrange(NODES_PER_JOB), gpu=rng.randrange(GPUS_PER_NODE))
            if name == "xid_catalog":
                fault.code = rng.choice(actionable)
            if name == "ib_flap_repeat" and len(idle_pool) >= NODES_PER_JOB - 1:
                # An earlier job on the same node flapped 20–40 minutes before (transient: retried);
                # this job starts on that node after it failed.
                flappy = job.nodes[fault.node_index]
                first_start = BASE_TS + d * 0.02
                flapped_at = max(at - rng.uniform(1200, 2400), first_start + 300.0)
                first = JobSim(
                    str(41_000 + j),
                    [flappy, *[idle_pool.pop() for _ in range(NODES_PER_JOB - 1)]],
                    first_start,
                    flapped_at + 600.0,
                    step_s=step_s,
                )
                first.fault = Fault("ib_link_flap", flapped_at, node_index=0)
                sim.jobs.append(first)
                job.start = flapped_at + 120.0
            elif name == "ib_flap_repeat":
                fault.name = "ib_link_flap"
            job.fault = fault
        elif rng.random() < 0.5:
            code = rng.choice(_ignored_xids())
            at = BASE_TS + d * rng.uniform(0.2, 0.8)
            node = nodes[0]
            line = f"NVRM: Xid (PCI:0000:1b:00): {code}, pid=4411, name=python, {catalog()[code].mnemonic}"
            sim.later.append((at, node, line))
            sim.label(f"b-xid{code}-{job.job_id}", "xid_ignored", at, job, [node])
        sim.jobs.append(job)
    return sim
