"""Wire-contract records of simulated clusters: the log, scheduler and NVML samples every preset writes.

The simulator (``generator.py``) decides *what* happens; these builders decide how it
looks on the wire (docs/wire-contract.md), so every preset, benchmark and test
writes records the same way.

>>> log_record(BASE_TS, "42", "gpu-node-01", 0, "step 1")["ts"]
'2026-12-01T10:00:00.000Z'
>>> job_record(BASE_TS, "42", "FAILED", ["gpu-node-01"], exit_code=1)["exit_code"]
1
"""

from __future__ import annotations

import random
from datetime import UTC, datetime
from typing import Any

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
