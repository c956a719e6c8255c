"""``explain`` names the rule that raised an anomaly, and says when the run's own config is needed."""

from __future__ import annotations

import pytest

from trainguard.cli.explain import _rule
from trainguard.dataflows.config import Settings
from trainguard.detectors.events import Anomaly
from trainguard.detectors.ids import evidence_line
from trainguard.detectors.settings import SiteSignature
from trainguard.detectors.signatures import use_site_signatures

TIMEOUT = "[Rank 3] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=4, OpType=ALLREDUCE) ran for 1800"
FLAP = "fabricmanager[811]: port 17 on switch sw-3 flapped"
SITE = SiteSignature(
    id="fm-flap",
    pattern=r"fabricmanager\[\d+\]: port \d+ on switch \S+ flapped",
    category="fabric_flap",
    layer="hardware",
)


def _anomaly(kind: str, category: str, layer: str, *evidence: str) -> Anomaly:
    return Anomaly(
        anomaly_id="an-1",
        detected_at=1.0,
        kind=kind,
        category=category,
        layer=layer,
        job_id="j1",
        evidence=list(evidence),
    )


@pytest.mark.parametrize("kind", ["crash", "node_unhealthy", "gpu_degraded"])
def test_a_site_signature_is_named_with_the_runs_config_and_asked_for_without_it(kind: str) -> None:
    flap = _anomaly(kind, "fabric_flap", "hardware", evidence_line("gpu-07", None, FLAP))
    try:
        use_site_signatures([SITE])
        assert _rule(flap, Settings()).startswith("signature site:fm-flap (fabric_flap, hardware)")
    finally:
        use_site_signatures([])
    assert "a site signature of the run's config, or a detector plugin, raised it (pass --config" in _rule(
        flap, Settings()
    )


def test_the_line_that_reads_as_the_category_is_named_before_its_consequences() -> None:
    incident = _anomaly(
        "crash",
        "nccl_timeout",
        "system",
        evidence_line("gpu-07", 1, "ConnectionError: peer closed"),
        evidence_line("gpu-07", 3, TIMEOUT),
    )
    assert _rule(incident, Settings()).startswith("signature nccl_watchdog_timeout (nccl_timeout, system)")


@pytest.mark.parametrize(
    "anomaly",
    [
        _anomaly("crash", "nccl_timeout", "system", evidence_line("gpu-07", 3, TIMEOUT)),
        _anomaly("crash", "node_fail", "hardware", "scheduler: job j1 NODE_FAIL"),
        _anomaly("node_unhealthy", "node_down", "hardware", "scheduler: node n1 DRAIN+DOWN: GPU is lost, Xid 79"),
        _anomaly("crash", "xid_79", "hardware", "n1/gpu0: NVML Xid 79: GPU has fallen off the bus"),
        _anomaly("gpu_degraded", "thermal_throttle", "hardware", "gpu 0 on n1: thermal slowdown for 3 samples"),
    ],
    ids=["catalogue", "job-state", "node-state", "nvml-xid", "gpu-health"],
)
def test_what_the_built_in_detectors_raise_needs_no_config(anomaly: Anomaly) -> None:
    assert "--config" not in _rule(anomaly, Settings())
