"""Live soak: a 1,000-GPU cluster published in real time to a real broker, ``trainguard run`` consuming.

    trainguard bench soak-live [--minutes 10]   (in a checkout: it starts the tests' Tansu broker)

Starts Tansu and ``trainguard run`` (a child process), publishes the ``scale``
preset on 125 nodes × 8 GPUs at 1× speed (timestamps rewritten to now), and every
10 s reads the child's RSS and its Prometheus metrics: events processed, consumer
lag, watermark delay (wall clock − event-time watermark: how far behind live the
flow runs, lateness included), and the detect step's batch-time p99.
"""

from __future__ import annotations

import re
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import msgspec

from trainguard.dataflows.metrics import bucket_quantile
from trainguard.datasets import generator
from trainguard.datasets.records import BASE_TS
from trainguard.detectors.events import parse_ts


def _rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def _scrape(port: int) -> dict[str, float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    values: dict[str, float] = {"events": 0.0, "lag": 0.0}
    for line in text.splitlines():
        if line.startswith("trainguard_events_total{"):
            values["events"] += float(line.rsplit(" ", 1)[1])
        elif line.startswith("trainguard_consumer_lag_messages{"):
            values["lag"] += float(line.rsplit(" ", 1)[1])
        elif line.startswith("trainguard_watermark_delay_seconds "):
            values["watermark_delay_s"] = float(line.rsplit(" ", 1)[1])
    buckets = {
        float(m[1]): float(m[2])  # float("+Inf") is inf
        for m in re.finditer(r'trainguard_step_seconds_bucket\{le="([^"]+)",step="detect"\} (\S+)', text)
    }
    p99 = bucket_quantile(buckets, 0.99)
    if p99 is not None:
        values["detect_p99_s"] = p99
    return values


def soak_live(minutes: float = 10.0) -> dict[str, Any]:
    """Run the live soak and return its report (published, processed, lag, watermark delay, RSS)."""
    from confluent_kafka import Producer

    from trainguard.benchmarks.bench import checkout_broker

    tansu = checkout_broker()
    from trainguard.dataflows.config import KafkaSettings
    from trainguard.dataflows.kafka_io import create_topics

    broker = tansu.start_tansu(tansu.tansu_binary())
    create_topics(KafkaSettings(brokers=[broker.address]))
    work = Path(tempfile.mkdtemp())
    config = work / "live.yaml"
    config.write_text("router:\n  idle_after_s: 1.0\n")
    port = tansu.free_port()
    run = tansu.start_trainguard(
        [
            "run",
            "--brokers",
            broker.address,
            "--out",
            str(work / "out"),
            "--metrics-port",
            str(port),
            "-c",
            str(config),
        ],
        stdout=open(work / "run.log", "wb"),  # noqa: SIM115 - the child owns it until it ends
        stderr=open(work / "run.err", "wb"),  # noqa: SIM115
    )
    producer = Producer({"bootstrap.servers": broker.address, "linger.ms": 20})
    enc = msgspec.json.Encoder()
    samples: list[dict[str, float]] = []
    published = 0
    stop = threading.Event()
    started = time.time()
    shift = started + 5 - BASE_TS  # the scenario starts 5 s from now

    def sample() -> None:
        while not stop.wait(10.0):
            try:
                samples.append({"t": time.time() - started, "rss_mib": _rss_mib(run.pid), **_scrape(port)})
                print(f"published {published:,}: {samples[-1]}", file=sys.stderr, flush=True)
            except OSError:
                continue

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        sim = generator.build("scale", seed=77, nodes=125, minutes=minutes)
        for topic, record in generator.stream(sim, chunk_s=10.0):
            ts = parse_ts(record["ts"]) + shift
            record["ts"] = ts
            delay = ts - time.time()
            if delay > 0:
                producer.flush(5)
                time.sleep(delay)
            key = record.get("job_id") or record.get("node")
            producer.produce(topic, enc.encode(record), key=str(key).encode() if key else None)
            published += 1
            if published % 1000 == 0:
                producer.poll(0)
        producer.flush(30)
        time.sleep(15)  # let the flow catch up with the last records
    finally:
        stop.set()
        sampler.join()
        tansu.stop_process(run)
        tansu.stop_process(broker.process)
    elapsed = time.time() - started
    quarter = max(1, len(samples) // 4)
    delays = sorted(s["watermark_delay_s"] for s in samples if "watermark_delay_s" in s)
    report = {
        "minutes": minutes,
        "published": published,
        "publish_rate_per_s": round(published / elapsed),
        "processed": int(samples[-1]["events"]) if samples else 0,
        "max_consumer_lag": max((s["lag"] for s in samples), default=None),
        "watermark_delay_s_p50": round(statistics.median(delays), 2) if delays else None,
        "watermark_delay_s_p99": round(delays[min(len(delays) - 1, int(0.99 * len(delays)))], 2) if delays else None,
        "detect_batch_p99_s": samples[-1].get("detect_p99_s") if samples else None,
        "rss_mib_first_quarter": round(max(s["rss_mib"] for s in samples[:quarter]), 1) if samples else None,
        "rss_mib_last_quarter": round(max(s["rss_mib"] for s in samples[-quarter:]), 1) if samples else None,
    }
    return report
