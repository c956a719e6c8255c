"""Prometheus metrics and the health endpoint."""

from __future__ import annotations

import urllib.error
import urllib.request

from prometheus_client import REGISTRY

from tests.conftest import DEMO_DIR, replay
from trainguard.dataflows import metrics
from trainguard.dataflows.metrics import MetricsServer
from trainguard.dataflows.replay import count_records


def value(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_a_run_counts_events_anomalies_and_actions():
    before = {k: value("trainguard_events_total", topic=k) for k in ("logs", "progress", "gpu", "scheduler")}
    crashes = value("trainguard_anomalies_total", kind="crash")
    drains = value("trainguard_actions_total", action="drain_node", status="recommended")
    result = replay(DEMO_DIR)
    after = {k: value("trainguard_events_total", topic=k) for k in before}
    assert sum(after.values()) - sum(before.values()) == count_records(DEMO_DIR)
    assert value("trainguard_anomalies_total", kind="crash") - crashes == len(result.by_kind("crash")) == 1
    drained = [a for a in result.actions if a.action == "drain_node" and a.status == "recommended"]
    assert value("trainguard_actions_total", action="drain_node", status="recommended") - drains == len(drained)
    assert value("trainguard_step_seconds_count", step="detect") > 0


def test_metrics_and_health_are_served_and_health_notices_a_stall():
    server = MetricsServer(0, stale_after_s=60.0)
    try:
        base = f"http://127.0.0.1:{server.port}"
        metrics.mark_progress()
        assert b"trainguard_events_total" in urllib.request.urlopen(f"{base}/metrics", timeout=5).read()
        assert urllib.request.urlopen(f"{base}/healthz", timeout=5).read() == b"ok\n"
        server.stale_after_s = -1.0  # nothing processed "recently" any more
        try:
            urllib.request.urlopen(f"{base}/healthz", timeout=5)
            raise AssertionError("a stalled flow must not report healthy")
        except urllib.error.HTTPError as exc:
            assert exc.code == 503
    finally:
        server.close()


def test_metrics_can_require_a_bearer_token_while_health_stays_open():
    server = MetricsServer(0, token="scrape-me")
    try:
        base = f"http://127.0.0.1:{server.port}"
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "scrape-me"}):
            try:
                urllib.request.urlopen(urllib.request.Request(f"{base}/metrics", headers=headers), timeout=5)
                raise AssertionError(f"{headers} must be refused")
            except urllib.error.HTTPError as exc:
                assert exc.code == 401
        ok = urllib.request.Request(f"{base}/metrics", headers={"Authorization": "Bearer scrape-me"})
        assert b"trainguard_events_total" in urllib.request.urlopen(ok, timeout=5).read()
        assert urllib.request.urlopen(f"{base}/healthz", timeout=5).status == 200
    finally:
        server.close()
