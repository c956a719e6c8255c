"""``explain`` names the rule that raised an anomaly, and says when the run's own config is needed."""

from __future__ import annotations

from trainguard.cli.explain import _rule
from trainguard.dataflows.config import Settings
from trainguard.detectors.events import Anomaly
from trainguard.detectors.ids import evidence_line
from trainguard.detectors.settings import SiteSignature
from trainguard.detectors.signatures import use_site_signatures

TIMEOUT = "[Rank 3] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=4, OpType=ALLREDUCE) ran for 1800"
FLAP = "fabricmanager[811]: port 17 on switch sw-3 flapped"


def _crash(category: str, layer: str, line: str) -> Anomaly:
    return Anomaly(
        anomaly_id="an-1",
        detected_at=1.0,
        kind="crash",
        category=category,
        layer=layer,
        job_id="j1",
        evidence=[evidence_line("gpu-07", 3, line)],
    )


def test_a_site_signature_is_named_with_the_runs_config_and_asked_for_without_it() -> None:
    site = [
        SiteSignature(
            id="fm-flap",
            pattern=r"fabricmanager\[\d+\]: port \d+ on switch \S+ flapped",
            category="fabric_flap",
            layer="hardware",
        ),
        SiteSignature(id="ours", pattern="Watchdog caught collective", category="site_hang", layer="application"),
    ]
    flap, timeout = _crash("fabric_flap", "hardware", FLAP), _crash("site_hang", "application", TIMEOUT)
    try:
        use_site_signatures(site)
        assert _rule(flap, Settings()).startswith("signature site:fm-flap (fabric_flap, hardware)")
        assert _rule(timeout, Settings()).startswith("signature site:ours (site_hang, application)")
    finally:
        use_site_signatures([])
    assert "a site signature of the run's config did (pass --config" in _rule(flap, Settings())
    # The catalogue reads the timeout line otherwise: say so instead of naming its rule as the run's.
    without = _rule(timeout, Settings())
    assert (
        without.startswith("signature nccl_watchdog_timeout (nccl_timeout, system)")
        and "the run raised site_hang: pass --config" in without
    )


def test_a_catalogue_anomaly_and_a_scheduler_one_need_no_config() -> None:
    plain = _rule(_crash("nccl_timeout", "system", TIMEOUT), Settings())
    assert plain.startswith("signature nccl_watchdog_timeout (nccl_timeout, system)") and "--config" not in plain
    node_fail = Anomaly(
        anomaly_id="an-2",
        detected_at=1.0,
        kind="crash",
        category="node_fail",
        layer="hardware",
        job_id="j1",
        evidence=["scheduler: job j1 NODE_FAIL"],
    )
    assert "--config" not in _rule(node_fail, Settings())
