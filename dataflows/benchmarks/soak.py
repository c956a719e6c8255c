"""Soak benchmark: one simulated day of a 1,000-GPU cluster through the real flow, at full speed.

Twenty-four consecutive hours of the ``scale`` preset on 125 nodes × 8 GPUs (a new
set of jobs every hour, so finished jobs come and go, the nodes stay), generated on
the fly and fed to the dataflow as raw JSON records (decode included). Prints
events/s, the p99 time the detect step spends on a batch, and the process RSS
sampled along the way — it must level off, not grow with the hours.

    trainguard bench soak [--hours 24]
"""

from __future__ import annotations

import resource
import threading
import time
from collections.abc import Iterator
from typing import Any

import msgspec
from bytewax.inputs import FixedPartitionedSource, StatefulSourcePartition

from trainguard.dataflows import metrics
from trainguard.dataflows.config import Settings
from trainguard.dataflows.flow import Outputs, build_flow
from trainguard.dataflows.records import RawRecord
from trainguard.datasets import generator
from trainguard.detectors.events import parse_ts

HOUR_S = 3600.0


def day_records(hours: int, nodes: int = 125) -> Iterator[tuple[str, dict[str, Any]]]:
    """Hour after hour of the scale preset, shifted in time, with job ids unique per hour."""
    for hour in range(hours):
        sim = generator.build("scale", seed=1000 + hour, nodes=nodes, minutes=60)
        for topic, record in generator.stream(sim):
            record["ts"] = parse_ts(record["ts"]) + hour * HOUR_S
            if record.get("job_id") is not None:
                record["job_id"] = f"{hour:02d}-{record['job_id']}"
            yield topic, record


class _DayPartition(StatefulSourcePartition[RawRecord, int]):
    def __init__(self, hours: int, counter: list[int]) -> None:
        self._records = day_records(hours)
        self._encode = msgspec.json.Encoder().encode
        self._offset = 0
        self._counter = counter

    def next_batch(self) -> list[RawRecord]:
        batch = []
        for topic, record in self._records:
            batch.append(RawRecord(topic, 0, self._offset, self._encode(record), "day"))
            self._offset += 1
            if len(batch) == 2000:
                break
        if not batch:
            raise StopIteration
        self._counter[0] = self._offset
        return batch

    def snapshot(self) -> int:
        return self._offset


class DaySource(FixedPartitionedSource[RawRecord, int]):
    def __init__(self, hours: int) -> None:
        self.hours = hours
        self.counter = [0]

    def list_parts(self) -> list[str]:
        return ["day"]

    def build_part(self, step_id: str, for_part: str, resume_state: int | None) -> _DayPartition:
        return _DayPartition(self.hours, self.counter)


def _rss_mib() -> float:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def _p99(histogram: Any) -> float | None:
    samples = histogram.collect()[0].samples
    return metrics.bucket_quantile(
        {float(s.labels["le"]): s.value for s in samples if s.name.endswith("_bucket")}, 0.99
    )


def soak(hours: int = 24) -> dict[str, Any]:
    """Run the soak and return its report (events/s, batch p99s, RSS over time)."""
    from trainguard.dataflows.pipeline import run

    source = DaySource(hours)
    anomalies: list[Any] = []
    samples: list[tuple[float, int, float]] = []
    done = threading.Event()

    def sample() -> None:
        while not done.wait(10.0):
            samples.append((time.monotonic() - started, source.counter[0], _rss_mib()))

    started = time.monotonic()
    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    run(build_flow(source, Settings(), Outputs(on_anomalies=anomalies.extend)))
    done.set()
    elapsed = time.monotonic() - started
    events = source.counter[0]
    quarter = max(1, len(samples) // 4)
    report = {
        "hours": hours,
        "events": events,
        "seconds": round(elapsed, 1),
        "events_per_s": round(events / elapsed),
        "anomalies": len(anomalies),
        "detect_batch_p99_s": _p99(metrics.DETECT_SECONDS),
        "route_batch_p99_s": _p99(metrics.ROUTE_SECONDS),
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "rss_mib_second_quarter": round(max(s[2] for s in samples[quarter : 2 * quarter]), 1)
        if len(samples) >= 4
        else None,
        "rss_mib_last_quarter": round(max(s[2] for s in samples[-quarter:]), 1) if len(samples) >= 4 else None,
        "rss_samples": [(round(t), n, round(r, 1)) for t, n, r in samples[:: max(1, len(samples) // 24)]],
    }
    return report
