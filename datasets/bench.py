"""Replay throughput benchmark: ``python -m datasets.bench [--jobs 16] [--minutes 30] [--workers 1]``.

Generates a synthetic cluster mix (Megatron log lines, per-rank progress, GPU
samples, scheduler events, with a crash, a hang and a straggler per job family),
writes it as a replay directory, and replays it through the real dataflow with
no outputs but in-process counters. Prints events/s for the decode step alone
and for the whole flow, and peak RSS.
"""

from __future__ import annotations

import argparse
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bytewax.testing import run_main

from datasets.scenario import BASE_TS, Job, Scenario


def synthetic_mix(jobs: int, minutes: float, seed: int = 1) -> Scenario:
    """``jobs`` two-node jobs: half log Megatron lines from rank 0, half send per-rank progress."""
    sc = Scenario(seed=seed, duration_s=minutes * 60)
    nodes: list[str] = []
    busy: dict[str, tuple[float, float]] = {}
    end = BASE_TS + minutes * 60
    for j in range(jobs):
        pair = [f"node-{2 * j:04d}", f"node-{2 * j + 1:04d}"]
        nodes += pair
        kind = j % 4
        job = Job(
            str(10_000 + j),
            pair,
            BASE_TS + 30,
            end - 30,
            step_s=1.0 + (j % 3) * 0.5,
            per_rank_progress=j % 2 == 1,
            stop_progress_at=BASE_TS + minutes * 30 if kind == 2 else None,
            slow_from=BASE_TS + minutes * 20 if kind == 3 else None,
            slow_rank=3 if kind == 3 else None,
            pauses=[(BASE_TS + minutes * 40, 90.0, "checkpoint")],
        )
        sc.run_job(job)
        sc.sched_job(job.end, job, "COMPLETED", 0)
        busy.update({n: (job.start, job.end) for n in pair})
    sc.gpu_samples(nodes, busy, missing={}, slow_gpu={}, xids={})
    return sc


def _settings(shards: int):
    from dataflows.config import Settings

    settings = Settings()
    settings.router.shards = shards
    return settings


def bench_flow(directory: str, shards: int):
    """The benchmark's flow for ``python -m bytewax.testing`` (multi-process runs)."""
    from dataflows.flow import Outputs, build_flow
    from dataflows.replay import ReplaySource

    return build_flow(ReplaySource(Path(directory)), _settings(shards), Outputs())


def main() -> None:
    parser = argparse.ArgumentParser(description="trainguard replay throughput benchmark")
    parser.add_argument("--jobs", type=int, default=16)
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--workers", type=int, default=1, help="Bytewax worker threads in this process")
    parser.add_argument(
        "--processes", type=int, default=0, help="instead: this many worker processes (python -m bytewax.testing -p)"
    )
    parser.add_argument("--shards", type=int, default=0, help="router shards (default: one per worker or process)")
    parser.add_argument("--repeat", type=int, default=5, help="runs of the flow; the median and the best are printed")
    args = parser.parse_args()

    from dataflows.flow import Outputs, build_flow
    from dataflows.replay import ReplaySource, count_records, merged_records
    from detectors.events import decode

    counts = {"anomalies": 0, "actions": 0, "dead": 0}

    def counter(name: str):
        def add(items: list) -> None:
            counts[name] += len(items)

        return add

    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        synthetic_mix(args.jobs, args.minutes).write(directory)
        (directory / "labels.jsonl").unlink()
        total = count_records(directory)

        records = [rec for _, rec in merged_records(directory)]
        started = time.perf_counter()
        for rec in records:
            decode(rec.topic, rec.payload)
        decode_rate = len(records) / (time.perf_counter() - started)
        del records

        timings = []
        for _ in range(args.repeat):
            counts.update(anomalies=0, actions=0, dead=0)
            outputs = Outputs(
                on_anomalies=counter("anomalies"), on_actions=counter("actions"), on_dead_letters=counter("dead")
            )
            shards = args.shards or max(args.workers, args.processes, 1)
            flow = build_flow(ReplaySource(directory), _settings(shards), outputs)
            started = time.perf_counter()
            if args.processes:
                spec = f"datasets.bench:bench_flow({str(directory)!r}, {shards})"
                subprocess.run(
                    [sys.executable, "-m", "bytewax.testing", spec, "-p", str(args.processes), "-w", "1"], check=True
                )
            elif args.workers == 1:
                run_main(flow)
            else:
                from bytewax._bytewax import cli_main

                cli_main(flow, workers_per_process=args.workers)
            timings.append(time.perf_counter() - started)

    timings.sort()
    median = timings[len(timings) // 2]
    rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"events                {total:>12,}")
    print(f"decode only           {decode_rate:>12,.0f} events/s (msgspec, one core)")
    print(
        f"full flow, median     {total / median:>12,.0f} events/s "
        f"({args.processes or args.workers} {'process' if args.processes else 'worker thread'}(s), "
        f"{args.shards or max(args.workers, args.processes, 1)} router shard(s), {median:.2f}s: "
        "replay read, decode, route, detect, policy)"
    )
    print(f"full flow, best       {total / timings[0]:>12,.0f} events/s (of {len(timings)} runs)")
    print(f"anomalies             {counts['anomalies']:>12,}")
    print(f"dead letters          {counts['dead']:>12,}")
    print(f"peak RSS              {rss_mib:>12,.0f} MiB")


if __name__ == "__main__":
    main()
