"""The Grafana dashboard and the alerting rules, checked with Debian's real Prometheus and promtool."""

from __future__ import annotations

import json
import re
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import yaml

from tests.conftest import DEMO_DIR, Broker, stop_process
from tests.support.kafka import produce_garbage
from tests.support.paths import ROOT
from tests.support.prometheus import prometheus_binary, running_prometheus
from tests.support.tansu import free_port, start_trainguard
from trainguard.dataflows.config import KafkaSettings
from trainguard.dataflows.kafka_io import create_topics, produce_replay

RULES = ROOT / "deploy" / "prometheus" / "trainguard-alerts.yaml"
RULE_TESTS = ROOT / "deploy" / "prometheus" / "trainguard-alerts.test.yaml"
DASHBOARD = ROOT / "deploy" / "grafana" / "trainguard-engine.json"


def _queries() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    return [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]


def _promql(expr: str) -> str:
    """A dashboard query with Grafana's variables given values, as Prometheus would receive it."""
    return expr.replace("$__rate_interval", "1m").replace("$instance", ".*")


def test_the_alerting_rules_pass_promtool_and_their_unit_tests():
    promtool = prometheus_binary("promtool")
    checked = subprocess.run([promtool, "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    alerts = {r["alert"] for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]}
    assert {"TrainguardEngineDown", "TrainguardWatermarkLag", "TrainguardDeadLetterRate"} <= alerts
    assert {"TrainguardBreakerOpen", "TrainguardNotificationFailures"} <= alerts
    tested = subprocess.run(
        [promtool, "test", "rules", RULE_TESTS.name], cwd=RULE_TESTS.parent, capture_output=True, text=True, timeout=60
    )
    assert tested.returncode == 0, tested.stdout + tested.stderr
    covered = set(re.findall(r"alertname: (\w+)", RULE_TESTS.read_text()))
    assert covered == alerts  # every alert has a case


def test_every_dashboard_query_is_valid_promql(tmp_path: Path):
    promtool = prometheus_binary("promtool")
    rules = {"groups": [{"name": "dashboard", "rules": []}]}
    for i, expr in enumerate(_queries()):
        rules["groups"][0]["rules"].append({"record": f"dashboard:panel_{i}", "expr": _promql(expr)})
    (tmp_path / "dashboard-rules.yaml").write_text(yaml.safe_dump(rules))
    checked = subprocess.run(
        [promtool, "check", "rules", str(tmp_path / "dashboard-rules.yaml")], capture_output=True, text=True
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr


def _query(url: str, path: str, **params: str) -> list:
    with urllib.request.urlopen(f"{url}{path}?{urllib.parse.urlencode(params)}", timeout=10) as response:
        return json.loads(response.read())["data"]


@pytest.mark.kafka
def test_a_real_prometheus_scrapes_a_running_engine_and_finds_every_metric_the_dashboard_queries(
    tansu: Broker, tmp_path: Path
):
    prometheus_binary()
    settings = KafkaSettings(brokers=[tansu.address])
    create_topics(settings)
    produce_replay(DEMO_DIR, settings)
    produce_garbage(tansu.address)
    port = free_port()
    run = start_trainguard(
        ["run", "--brokers", tansu.address, "--metrics-port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    names = sorted({name for expr in _queries() for name in re.findall(r"\btrainguard_[a-z_]+", expr)})
    missing = names
    try:
        with running_prometheus(tmp_path / "prometheus", [f"127.0.0.1:{port}"], 1.0, job="trainguard") as url:
            deadline = time.monotonic() + 90
            while missing and time.monotonic() < deadline:
                time.sleep(1)
                missing = [n for n in names if not _query(url, "/api/v1/series", **{"match[]": n})]
            up = _query(url, "/api/v1/query", query='up{job="trainguard"}')["result"]
    finally:
        stop_process(run)
    assert missing == [], f"the dashboard queries metrics the engine never exported: {missing}"
    assert [float(r["value"][1]) for r in up] == [1.0]
    assert "trainguard_anomalies_total" in names and "trainguard_watermark_delay_seconds" in names
