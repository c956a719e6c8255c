"""A real training job watched live: ``trainguard bench realjob`` and the real-job tests (in a checkout, with torch).

A :class:`Cluster` is what a site runs: a Kafka-protocol broker (Tansu), ``trainguard run`` live on it in
monitor mode, and a listener on the anomalies and actions topics. A :class:`RealJob` is what a user runs:
``torchrun`` (gloo, CPU) starting :mod:`trainguard.datasets.realjob_train` with the progress probe
publishing to the broker, each rank's stdout/stderr in torchrun's own log layout (``--log-dir
--redirects 3``) and the launcher's output in ``launcher.log``, all followed by ``trainguard ship-logs``.
The job's start and end are published the way ``trainguard watch-slurm`` would publish a scheduler's.

Faults come from outside the job: a signal to one rank's process (found by its ``RANK`` in
``/proc/PID/environ``) or to the launcher, or a line in a rank's fault file that its data loader reads
(see :mod:`trainguard.datasets.realjob_train`). Every process started here is stopped by its PID.
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

from trainguard.datasets.bench import checkout_broker

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

    def stop(self) -> None:
        self._stop.set()
        self._listener.join(5)
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
        argv += ["-m", "trainguard.datasets.realjob_train", "--fault-dir", str(self.faults), "--out", str(self.dir)]
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


# -- the faults, one job each ----------------------------------------------------------------------------------------
@dataclass
class Outcome:
    """What one faulted job raised: the anomaly the fault should raise (``None``: none) and its latency.

    ``latency_s``: wall clock from the injection to the anomaly on the topic — for a hang, from the job's
    last step (the anomaly's ``onset_ts``), since a hang cannot be told before the deadline after it.
    """

    fault: str
    job: RealJob
    found: Arrival | None
    latency_s: float | None
    opened: list[dict[str, Any]]

    @property
    def kinds(self) -> list[tuple[str, str]]:
        return [(a["kind"], a["category"]) for a in self.opened]


def _outcome(fault: str, job: RealJob, kind: str | None, since: float | None, timeout_s: float) -> Outcome:
    found = None if kind is None else job.cluster.wait_for(job.job_id, kind, timeout_s)
    if found is not None and since is None:
        since = found.record["onset_ts"]
    latency = None if found is None or since is None else found.at - since
    return Outcome(fault, job, found, latency, [])


def _settle(outcome: Outcome, seconds: float) -> Outcome:
    """Wait ``seconds`` for late records, then take the job's opened anomalies."""
    time.sleep(seconds)
    outcome.opened = [a.record for a in outcome.job.cluster.opened(outcome.job.job_id)]
    return outcome


def kill(cluster: Cluster, job_id: str, settle: bool = True) -> Outcome:
    """``SIGKILL`` of rank 2 mid-run (the OOM killer, a person): a crash whose root cause is rank 2."""
    job = RealJob(cluster, job_id, "--steps", "500").start()
    try:
        job.wait_step(20)
        outcome = _outcome("kill", job, "crash", job.signal(2, signal.SIGKILL), 30)
        job.wait_exit(60)
        return _settle(outcome, 5 if settle else 0)
    finally:
        job.stop()


def stop(cluster: Cluster, job_id: str, settle: bool = True) -> Outcome:
    """``SIGSTOP`` of rank 2 (a frozen process): a hang named from its silence. With ``settle``, the job runs on
    until gloo times out (45 s) and torchelastic kills the stopped rank (30 s later): those lines join the hang."""
    job = RealJob(cluster, job_id, "--steps", "1000", "--timeout-s", "45").start()
    try:
        job.wait_step(20)
        job.signal(2, signal.SIGSTOP)
        outcome = _outcome("stop", job, "hang", None, 75)
        if settle:
            job.wait_exit(120)
        return _settle(outcome, 5 if settle else 0)
    finally:
        job.stop()


def slow(cluster: Cluster, job_id: str, settle: bool = True) -> Outcome:
    """Rank 2's data loader waits 50 % of a step more per batch (a starved input pipeline): a straggler."""
    job = RealJob(cluster, job_id, "--steps", "600").start()
    try:
        job.wait_step(30)
        return _settle(_outcome("slow", job, "straggler", job.fault(2, "slow 0.11"), 70), 0)
    finally:
        job.cancel()
        job.wait_exit(60, "CANCELLED")
        job.stop()


def nan(cluster: Cluster, job_id: str, settle: bool = True) -> Outcome:
    """One corrupted batch on rank 1: the reduced loss and every gradient turn NaN."""
    job = RealJob(cluster, job_id, "--steps", "600").start()
    try:
        job.wait_step(20)
        return _settle(_outcome("nan", job, "numerics", job.fault(1, "nan"), 40), 0)
    finally:
        job.cancel()
        job.wait_exit(60, "CANCELLED")
        job.stop()


def healthy(cluster: Cluster, job_id: str, settle: bool = True) -> Outcome:
    """A healthy run: a ~90 s ``torch.save`` to a slow filesystem after step 30 (torchtitan's own messages),
    an evaluation loop of 40 s that prints nothing after step 60, completion at step 90. Nothing to raise."""
    args = ["--steps", "90", "--ckpt-at", "30", "--ckpt-mib", "90", "--ckpt-mib-per-s", "1.0"]
    job = RealJob(cluster, job_id, *args, "--eval-at", "60", "--eval-s", "40", "--timeout-s", "150").start()
    try:
        if job.wait_exit(300) != 0:
            raise RuntimeError(f"the healthy job failed: {job.launcher_output()[-2000:]}")
        return _settle(Outcome("healthy", job, None, None, []), 8)
    finally:
        job.stop()


def cancel(cluster: Cluster, job_id: str, settle: bool = True) -> Outcome:
    """The whole job cancelled as ``scancel`` does (SIGTERM to the launcher), with no scheduler to say so:
    the launcher's own lines tell the end. Nothing to raise."""
    job = RealJob(cluster, job_id, "--steps", "600").start()
    try:
        job.wait_step(20)
        job.cancel()
        job.launcher.wait(60)
        # A held cascade would be reported 10 s after it began; a hang 55 s after the last step.
        return _settle(Outcome("cancel", job, None, None, []), 20)
    finally:
        job.stop()


FAULTS = {"kill": kill, "stop": stop, "slow": slow, "nan": nan, "healthy": healthy, "cancel": cancel}
EXPECTED = {  # what each fault must raise: kind, category, ranks (None: not checked)
    "kill": ("crash", "process_crash", [2]),
    "stop": ("hang", "no_progress", [2]),
    "slow": ("straggler", None, [2]),
    "nan": ("numerics", "nan_loss", None),
}


def bench(faults: list[str], repeat: int) -> None:
    """``trainguard bench realjob``: each fault ``repeat`` times on a fresh job; latency and root cause per fault."""
    import statistics

    cluster = new_cluster()
    results: dict[str, list[Outcome]] = {f: [] for f in faults}
    try:
        time.sleep(3)
        for round_ in range(repeat):
            for fault in faults:  # faults take turns, so each meets the machine in the same moods
                results[fault].append(FAULTS[fault](cluster, f"bench-{fault}-{round_}", settle=False))
                print(f"  round {round_ + 1} {fault}: {_verdict(results[fault][-1])}", flush=True)
    finally:
        cluster.stop()
    print(f"\nreal torchrun job, 4 gloo ranks on {os.cpu_count()} cores, {repeat} rounds; latency on the wall clock")
    print("| fault | raised as | root cause right | latency median | max |")
    print("|---|---|---|---|---|")
    for fault, outcomes in results.items():
        latencies = [o.latency_s for o in outcomes if o.latency_s is not None]
        right = sum(_verdict(o) == "right" for o in outcomes)
        raised = {f"{o.found.record['kind']}/{o.found.record['category']}" for o in outcomes if o.found} or {"nothing"}
        median = f"{statistics.median(latencies):.1f} s" if latencies else "-"
        worst = f"{max(latencies):.1f} s" if latencies else "-"
        print(f"| {fault} | {', '.join(sorted(raised))} | {right}/{len(outcomes)} | {median} | {worst} |")


def _verdict(outcome: Outcome) -> str:
    want = EXPECTED.get(outcome.fault)
    if want is None:
        return "right" if not outcome.opened else f"raised {outcome.kinds}"
    if outcome.found is None:
        return "missed"
    record = outcome.found.record
    kind, category, ranks = want
    ok = record["kind"] == kind and category in (None, record["category"]) and ranks in (None, record["ranks"])
    return "right" if ok else f"wrong: {record['kind']}/{record['category']} ranks {record['ranks']}"
