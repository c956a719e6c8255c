"""A real training job watched live: ``trainguard bench realjob`` and the real-job tests (in a checkout, with torch).

A :class:`Cluster` is what a site runs: a Kafka-protocol broker (Tansu), ``trainguard run`` live on it in
monitor mode, the node's stack agent (``trainguard collect-stacks``, answering the flow's ``diagnose``
actions), and a listener on the anomalies and actions topics. A :class:`RealJob` is what a user runs:
``torchrun`` (gloo, CPU) starting :mod:`trainguard.benchmarks.realjob_train` with the progress probe
publishing to the broker, each rank's stdout/stderr in torchrun's own log layout (``--log-dir
--redirects 3``) and the launcher's output in ``launcher.log``, all followed by ``trainguard ship-logs``.
The job's start and end are published the way ``trainguard watch-slurm`` would publish a scheduler's.

Faults come from outside the job: a signal to one rank's process (found by its ``RANK`` in
``/proc/PID/environ``) or to the launcher, or a line in a rank's fault file that its data loader reads
(see :mod:`trainguard.benchmarks.realjob_train`). Every process started here is stopped by its PID.
The faults themselves are :mod:`trainguard.benchmarks.realjob_faults`.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from trainguard.benchmarks.bench import checkout_broker

STEP_LINE = re.compile(rb"step:\s*(\d+)\s+loss")
NODE = socket.gethostname().split(".")[0]


@dataclass
class Arrival:
    """A record on an output topic and when it arrived (wall clock)."""

    at: float
    record: dict[str, Any]


@dataclass
class Cluster:
    """A broker, the live flow and a listener on its outputs."""

    workdir: Path
    config: str = ""
    anomalies: list[Arrival] = field(default_factory=list)
    actions: list[Arrival] = field(default_factory=list)

    def start(self) -> Cluster:
        self.tansu = checkout_broker()
        self.broker = self.tansu.start_tansu(self.tansu.tansu_binary())
        from trainguard.dataflows.config import KafkaSettings
        from trainguard.dataflows.kafka_io import create_topics

        create_topics(KafkaSettings(brokers=[self.broker.address]))
        config = self.workdir / "trainguard.yaml"
        config.write_text(self.config or "{}\n")
        self._flow_log = open(self.workdir / "flow.log", "wb")  # noqa: SIM115 - closed by stop()
        self.flow = self.tansu.start_trainguard(
            [
                "run",
                "--brokers",
                self.broker.address,
                "--config",
                str(config),
                "--out",
                str(self.workdir / "out"),
                "--metrics-port",
                "0",
            ],
            stdout=self._flow_log,
            stderr=subprocess.STDOUT,
        )
        # The node's stack agent: answers the flow's diagnose actions with py-spy dumps of the job's ranks.
        self.agent = self.tansu.start_trainguard(
            ["collect-stacks", "--brokers", self.broker.address, "--node", NODE, "--min-interval", "0"],
            stdout=self._flow_log,
            stderr=subprocess.STDOUT,
        )
        self._stop = threading.Event()
        self._listener = threading.Thread(target=self._listen, daemon=True)
        self._listener.start()
        return self

    def _listen(self) -> None:
        from confluent_kafka import Consumer, TopicPartition

        consumer = Consumer({"bootstrap.servers": self.broker.address, "group.id": "realjob"})
        consumer.assign([TopicPartition("anomalies", 0, 0), TopicPartition("actions", 0, 0)])
        while not self._stop.is_set():
            for msg in consumer.consume(100, 0.1):
                if msg.error() is None:
                    into = self.anomalies if msg.topic() == "anomalies" else self.actions
                    into.append(Arrival(time.time(), msgspec.json.decode(msg.value())))
        consumer.close()

    def publish(self, topic: str, record: dict[str, Any]) -> None:
        from confluent_kafka import Producer

        producer = Producer({"bootstrap.servers": self.broker.address})
        producer.produce(topic, msgspec.json.encode(record), key=str(record.get("job_id", "")).encode())
        producer.flush(10)

    def opened(self, job_id: str) -> list[Arrival]:
        """The anomalies of ``job_id`` as first published (resolutions and updates left out)."""
        first: dict[str, Arrival] = {}
        for a in list(self.anomalies):
            if a.record.get("job_id") == job_id:
                first.setdefault(a.record["anomaly_id"], a)
        return list(first.values())

    def latest(self, job_id: str) -> dict[str, dict[str, Any]]:
        """The newest record of each anomaly of ``job_id``, by id."""
        return {a.record["anomaly_id"]: a.record for a in list(self.anomalies) if a.record.get("job_id") == job_id}

    def wait_for(self, job_id: str, kind: str, timeout_s: float) -> Arrival | None:
        deadline = time.time() + timeout_s
        while time.time() < deadline:
            found = [a for a in self.opened(job_id) if a.record["kind"] == kind]
            if found:
                return found[0]
            time.sleep(0.1)
        return None

    def revised(self, anomaly_id: str, timeout_s: float) -> dict[str, Any] | None:
        """The anomaly's revision (stacks attached to a hang), once it arrives."""
        deadline = time.time() + timeout_s
        while time.time() < deadline:
            for a in list(self.anomalies):
                if a.record["anomaly_id"] == anomaly_id and a.record.get("revised_at") is not None:
                    return a.record
            time.sleep(0.1)
        return None

    def stop(self) -> None:
        self._stop.set()
        self._listener.join(5)
        self.tansu.stop_process(self.agent)
        self.tansu.stop_process(self.flow)
        self._flow_log.close()
        self.broker.stop()


class RealJob:
    """One ``torchrun`` job of four gloo ranks on this machine, and its log shipper."""

    def __init__(self, cluster: Cluster, job_id: str, *args: str, ranks: int = 4) -> None:
        self.cluster = cluster
        self.job_id = job_id
        self.ranks = ranks
        self.dir = cluster.workdir / f"job-{job_id}"
        self.faults = self.dir / "faults"
        self.faults.mkdir(parents=True, exist_ok=True)
        self.args = list(args)
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self) -> RealJob:
        env = {
            **os.environ,
            "TRAINGUARD_BROKERS": self.cluster.broker.address,
            "TRAINGUARD_JOB_ID": self.job_id,
            "PYTHONUNBUFFERED": "1",
        }
        argv = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(self.ranks)]
        argv += ["--log-dir", str(self.dir / "logs"), "--redirects", "3", "--rdzv-id", self.job_id]
        argv += ["-m", "trainguard.benchmarks.realjob_train", "--fault-dir", str(self.faults), "--out", str(self.dir)]
        launcher_log = open(self.dir / "launcher.log", "wb")  # noqa: SIM115 - the child keeps it
        self.cluster.publish("scheduler", self._state("RUNNING"))
        self.launcher = subprocess.Popen(
            argv + self.args, stdout=launcher_log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        launcher_log.close()
        self.procs.append(self.launcher)
        pattern = str(self.dir / "logs" / "**" / "std*.log")
        self.procs.append(
            self.cluster.tansu.start_trainguard(
                [
                    "ship-logs",
                    pattern,
                    str(self.dir / "launcher.log"),
                    "--brokers",
                    self.cluster.broker.address,
                    "--job",
                    self.job_id,
                    "--node",
                    NODE,
                    "--interval",
                    "0.2",
                    "--state",
                    str(self.dir / "ship.json"),
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        )
        return self

    def _state(self, state: str, exit_code: int | None = None) -> dict[str, Any]:
        record: dict[str, Any] = {"ts": time.time(), "kind": "job", "job_id": self.job_id, "state": state}
        record["nodes"] = [NODE]
        if exit_code is not None:
            record["exit_code"] = exit_code
        return record

    def last_step(self, rank: int = 0) -> int:
        files = list((self.dir / "logs").glob(f"*/attempt_0/{rank}/stdout.log"))
        steps = STEP_LINE.findall(files[0].read_bytes()) if files else []
        return int(steps[-1]) if steps else 0

    def wait_step(self, step: int, timeout_s: float = 120.0) -> float:
        """Wait until rank 0 printed ``step``; the wall time it was seen."""
        deadline = time.time() + timeout_s
        while time.time() < deadline:
            if self.last_step() >= step:
                return time.time()
            if self.launcher.poll() is not None:
                raise RuntimeError(f"job {self.job_id} exited early: {self.launcher_output()[-2000:]}")
            time.sleep(0.05)
        raise TimeoutError(f"job {self.job_id} did not reach step {step} in {timeout_s:.0f}s")

    def pid(self, rank: int) -> int:
        """The process of ``rank`` (read from /proc: its environment names the job and rank)."""
        want = {f"TRAINGUARD_JOB_ID={self.job_id}".encode(), f"RANK={rank}".encode()}
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                environ = set((entry / "environ").read_bytes().split(b"\0"))
            except OSError:
                continue
            if want <= environ:
                return int(entry.name)
        raise LookupError(f"no process of rank {rank} of job {self.job_id}")

    def signal(self, rank: int, sig: signal.Signals) -> float:
        os.kill(self.pid(rank), sig)
        return time.time()

    def fault(self, rank: int, what: str) -> float:
        """Ask ``rank``'s data loader to misbehave from its next batch on (see realjob_train)."""
        tmp = self.faults / f".rank{rank}"
        tmp.write_text(what)
        tmp.replace(self.faults / f"rank{rank}")
        return time.time()

    def cancel(self) -> float:
        """Stop the whole job as ``scancel`` does: SIGTERM to the launcher."""
        self.launcher.send_signal(signal.SIGTERM)
        return time.time()

    def wait_exit(self, timeout_s: float, state: str | None = None) -> int | None:
        """Wait for the launcher to exit, then publish the job's end as a scheduler would."""
        try:
            code = self.launcher.wait(timeout_s)
        except subprocess.TimeoutExpired:
            return None
        self.cluster.publish("scheduler", self._state(state or ("COMPLETED" if code == 0 else "FAILED"), code))
        return code

    def launcher_output(self) -> str:
        return (self.dir / "launcher.log").read_text(errors="replace")

    def stop(self) -> None:
        """Stop everything this job started, by PID (continuing a stopped rank first)."""
        for rank in range(self.ranks):
            with contextlib.suppress(LookupError, OSError):
                os.kill(self.pid(rank), signal.SIGCONT)
        for proc in reversed(self.procs):
            self.cluster.tansu.stop_process(proc)
        for rank in range(self.ranks):  # a rank the launcher left behind
            with contextlib.suppress(LookupError, OSError):
                os.kill(self.pid(rank), signal.SIGKILL)


def new_cluster(config: str = "") -> Cluster:
    return Cluster(Path(tempfile.mkdtemp(prefix="trainguard-realjob-")), config).start()
