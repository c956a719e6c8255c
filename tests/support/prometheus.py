"""Debian's real ``prometheus`` binary, started by a test on a loopback port and stopped by its PID."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.conftest import stop_process
from trainguard.dataflows.ports import free_port


def prometheus_binary(name: str = "prometheus") -> str:
    """The binary (or its ``promtool``), or a skip (a failure where CI requires it: TRAINGUARD_REQUIRE_PROMETHEUS)."""
    binary = shutil.which(name)
    if binary is None:
        if os.environ.get("TRAINGUARD_REQUIRE_PROMETHEUS"):
            pytest.fail(f"{name} is required here (TRAINGUARD_REQUIRE_PROMETHEUS) but missing")
        pytest.skip(f"needs Debian's prometheus package ({name})")
    return binary


@contextmanager
def running_prometheus(
    work: Path, targets: list[str], scrape_interval_s: float = 1.0, job: str = "dcgm"
) -> Iterator[str]:
    """A Prometheus that scrapes ``targets`` (host:port, /metrics) as ``job``; yields its URL."""
    binary = prometheus_binary()
    work.mkdir(parents=True, exist_ok=True)
    listed = ", ".join(f'"{t}"' for t in targets)
    (work / "prometheus.yml").write_text(
        "global:\n"
        f"  scrape_interval: {scrape_interval_s:g}s\n"
        f"  scrape_timeout: {scrape_interval_s:g}s\n"
        "scrape_configs:\n"
        f"  - job_name: {job}\n"
        f"    static_configs:\n      - targets: [{listed}]\n"
    )
    port = free_port()
    proc = subprocess.Popen(
        [
            binary,
            f"--config.file={work / 'prometheus.yml'}",
            f"--storage.tsdb.path={work / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_ready(url, proc, "Prometheus")
        yield url
    finally:
        stop_process(proc)


def wait_until_ready(url: str, proc: subprocess.Popen[bytes], name: str, timeout_s: float = 30.0) -> None:
    """Until a Prometheus-project server (Prometheus, Alertmanager) answers ``/-/ready`` with 200."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(f"{url}/-/ready", timeout=1) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        if time.monotonic() > deadline or proc.poll() is not None:
            raise RuntimeError(f"{name} did not start")
        time.sleep(0.2)


def wait_for_scrapes(url: str, targets: int, timeout_s: float = 30.0) -> None:
    """Until Prometheus has scraped every target once (its first scrape waits for service discovery, ~5 s)."""
    import json

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with urllib.request.urlopen(f"{url}/api/v1/query?query=up", timeout=5) as response:
            result = json.loads(response.read())["data"]["result"]
        if sum(float(r["value"][1]) == 1.0 for r in result) >= targets:
            return
        time.sleep(0.2)
    raise RuntimeError(f"Prometheus did not scrape its {targets} target(s) within {timeout_s:g}s")
