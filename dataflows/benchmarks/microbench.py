"""Per-event cost of each detector, in microseconds: ``trainguard bench detectors``.

Each line times one call on a realistic input, many times over, on one core,
with no Bytewax around it — the cost a detector adds to every event of its kind.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from trainguard.detectors.drift import DriftDetector
from trainguard.detectors.events import GpuSample, LogRecord, ProgressRecord, decode
from trainguard.detectors.hang import HangDetector
from trainguard.detectors.monitor import JobMonitor, NodeMonitor
from trainguard.detectors.progress_parsers import parse_progress
from trainguard.detectors.rank_scores import RankScorer
from trainguard.detectors.routing import Router, RouterSettings
from trainguard.detectors.signatures import match_line
from trainguard.detectors.templates import ErrorTemplates

MEGATRON = (
    " iteration     5426/  250000 | consumed samples:        43408 | elapsed time per iteration (ms): 4247.9 | "
    "learning rate: 2.999E-04 | global batch size:     8 | lm loss: 2.1E+00 | grad norm: 0.31 | "
    "number of skipped iterations:   0 | number of nan iterations:   0 | samples per second: 1.883 |"
)
INFO = "[2026-12-01 10:00:00,000] [INFO] [engine.py:1200] saving optimizer state dict to shard 3 of 8"
FATAL = "[rank3]:[E1201 10:21:00.1 ProcessGroupNCCL.cpp:607] [Rank 3] Watchdog caught collective operation timeout"
GPU_JSON = (
    b'{"ts": 1796205600.25, "node": "gpu-node-0042", "gpu": 3, "util_pct": 98.5, "mem_used_mib": 61234.0, '
    b'"temp_c": 66.0, "power_w": 560.5, "sm_clock_mhz": 1980.0, "ecc_sbe_total": 12, "ecc_dbe_total": 0, '
    b'"pcie_replay_total": 3, "nvlink_crc_total": 1, "throttle_reasons": 0, "xid": null}'
)


def per_call_us(fn: Callable[[int], object], n: int) -> float:
    started = time.perf_counter()
    for i in range(n):
        fn(i)
    return (time.perf_counter() - started) / n * 1e6


def detector_costs() -> list[tuple[str, float]]:
    """``(what, µs per call)`` for each detector step."""
    rows: list[tuple[str, float]] = []
    rows.append(("decode gpu record (msgspec + validation)", per_call_us(lambda i: decode("gpu", GPU_JSON), 100_000)))
    rows.append(("signature match, ordinary log line", per_call_us(lambda i: match_line(INFO), 100_000)))
    rows.append(("signature match, fatal log line", per_call_us(lambda i: match_line(FATAL), 50_000)))
    rows.append(("progress parse, Megatron line", per_call_us(lambda i: parse_progress(MEGATRON), 100_000)))
    templates = ErrorTemplates()
    rows.append(
        ("error templates, non-error line (Megatron)", per_call_us(lambda i: templates.observe(MEGATRON), 100_000))
    )
    rows.append(("error templates, non-error line (INFO)", per_call_us(lambda i: templates.observe(INFO), 100_000)))
    rows.append(
        (
            "error templates, error line (mask + drain3)",
            per_call_us(lambda i: templates.observe(f"{FATAL} on rank {i % 64} after {i} ms"), 20_000),
        )
    )

    hang = HangDetector()
    rows.append(
        (
            "hang detector, one progress record",
            per_call_us(lambda i: hang.observe_progress(float(i), i, i % 8, "n"), 100_000),
        )
    )

    job = JobMonitor("1")
    rows.append(
        (
            "job monitor, per-rank progress record (64 ranks)",
            per_call_us(
                lambda i: job.observe(
                    ProgressRecord(
                        ts=float(i // 64),
                        job_id="1",
                        node=f"n{i % 64 // 8}",
                        rank=i % 64,
                        step=i // 64,
                        step_time_s=1.0,
                        compute_time_s=0.7,
                    )
                ),
                64_000,
            ),
        )
    )
    job2 = JobMonitor("2")
    rows.append(
        (
            "job monitor, Megatron log line",
            per_call_us(
                lambda i: job2.observe(LogRecord(ts=float(i), job_id="2", node="n", rank=0, line=MEGATRON)), 50_000
            ),
        )
    )
    job3 = JobMonitor("3")
    rows.append(
        (
            "job monitor, GPU sample (peers + health rules)",
            per_call_us(
                lambda i: job3.observe(
                    GpuSample(
                        ts=float(i // 64),
                        node=f"n{i % 64 // 8}",
                        gpu=i % 8,
                        util_pct=99.0,
                        temp_c=65.0,
                        power_w=560.0,
                        sm_clock_mhz=1980.0,
                        ecc_sbe_total=1,
                        pcie_replay_total=0,
                        nvlink_crc_total=0,
                        throttle_reasons=0,
                    )
                ),
                64_000,
            ),
        )
    )
    node = NodeMonitor("n")
    rows.append(
        (
            "node monitor, GPU sample (idle node)",
            per_call_us(
                lambda i: node.observe(GpuSample(ts=float(i // 8), node="n", gpu=i % 8, ecc_sbe_total=1, util_pct=0.0)),
                64_000,
            ),
        )
    )
    scorer = RankScorer()

    def score_step(i: int) -> None:
        for rank in range(64):
            scorer.observe(rank, "n", 0.7)
        scorer.evaluate(float(i))

    rows.append(("rank scores, one step of 64 ranks (observe ×64 + evaluate)", per_call_us(score_step, 2_000)))
    drift = DriftDetector()
    rows.append(
        (
            "drift detector (online novelty score), one value",
            per_call_us(lambda i: drift.score_one(35.0 + (i % 13) * 0.1), 200_000),
        )
    )
    router = Router(RouterSettings(lateness_s=2.0))
    records = [
        ("p", (1, 0, i), ProgressRecord(ts=float(i) * 0.01, job_id=str(i % 50), node="n", rank=0, step=i), None)
        for i in range(100_000)
    ]
    started = time.perf_counter()
    for start in range(0, len(records), 1000):
        router.route_batch(records[start : start + 1000])
    rows.append(
        ("router (reorder buffer, keying, ticks), per event", (time.perf_counter() - started) / len(records) * 1e6)
    )

    return rows
