"""Notifications reach people: a real Alertmanager (Debian's prometheus-alertmanager) and apprise webhooks.

Alertmanager is started by the test on a loopback port and queried through its v2 API; the
apprise path posts to a local HTTP receiver (``json://``), the way it would to a Slack or
Teams webhook.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

import pytest

from tests.conftest import DEMO_DIR, replay
from tests.support.prometheus import wait_until_ready
from tests.support.tansu import stop_process
from trainguard.actions.audit import read_entries
from trainguard.actions.notify import Notifier, NotifySettings
from trainguard.actions.records import Action
from trainguard.dataflows.config import Settings
from trainguard.dataflows.ports import free_port
from trainguard.detectors.events import Anomaly

ALERTMANAGER = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")


@pytest.fixture(scope="module")
def alertmanager(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    if ALERTMANAGER is None:
        if os.environ.get("TRAINGUARD_REQUIRE_ALERTMANAGER"):
            pytest.fail("prometheus-alertmanager is required here (TRAINGUARD_REQUIRE_ALERTMANAGER) but missing")
        pytest.skip("needs Debian's prometheus-alertmanager")
    work = tmp_path_factory.mktemp("alertmanager")
    (work / "am.yml").write_text('route:\n  receiver: "null"\nreceivers:\n  - name: "null"\n')
    port = free_port()
    proc = subprocess.Popen(
        [
            ALERTMANAGER,
            f"--config.file={work / 'am.yml'}",
            f"--storage.path={work / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--cluster.listen-address=",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_ready(url, proc, "Alertmanager")
        yield url
    finally:
        stop_process(proc)


def _alerts(url: str, anomaly_id: str | None = None) -> list[dict]:
    query = f"?filter=anomaly_id%3D%22{anomaly_id}%22" if anomaly_id else ""
    with urllib.request.urlopen(f"{url}/api/v2/alerts{query}", timeout=5) as r:
        return json.loads(r.read())


def _anomaly(n: int = 1, **kw) -> Anomaly:
    now = time.time()
    base = dict(
        anomaly_id=f"an-{n}",
        detected_at=now - 60,
        kind="crash",
        category="xid_79",
        layer="hardware",
        transient=False,
        job_id="42",
        nodes=["gpu-node-07"],
        evidence=["gpu-node-07: NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus."],
    )
    return Anomaly(**{**base, **kw})


def _action(anomaly: Anomaly, status: str = "recommended") -> Action:
    return Action(
        action_id=f"{anomaly.anomaly_id}-drain",
        anomaly_id=anomaly.anomaly_id,
        decided_at=anomaly.detected_at,
        action="drain_node",
        target="gpu-node-07",
        status=status,  # type: ignore[arg-type]
        reason="xid_79: GPU lost",
    )


def test_an_anomaly_is_one_alert_updated_by_its_actions_and_ended_when_it_resolves(alertmanager: str) -> None:
    notifier = Notifier(NotifySettings(alertmanager=[alertmanager]))
    opened = _anomaly(1)
    assert all(d.ok for d in notifier.anomaly(opened))
    (alert,) = _alerts(alertmanager, "an-1")
    assert alert["labels"] | {"alertname": "TrainguardAnomaly"} == alert["labels"]
    assert (alert["labels"]["kind"], alert["labels"]["node"], alert["labels"]["job_id"]) == (
        "crash",
        "gpu-node-07",
        "42",
    )
    assert alert["annotations"]["summary"] == "crash/xid_79 (hardware) on gpu-node-07, job 42"
    assert alert["annotations"]["runbook_url"].endswith("docs/runbooks.md#crash")
    assert alert["status"]["state"] == "active"
    assert all(d.ok for d in notifier.action(_action(opened)))
    (alert,) = _alerts(alertmanager, "an-1")  # the same alert, its annotations updated
    assert alert["annotations"]["actions"] == "drain_node gpu-node-07 (recommended, monitor)"
    notifier.anomaly(_anomaly(1, resolved_at=time.time() - 1, resolution="job ended"))
    assert _alerts(alertmanager, "an-1") == []  # resolved: no longer an active alert
    # Below the configured severity, nothing is sent.
    assert (
        Notifier(NotifySettings(alertmanager=[alertmanager], min_severity="critical")).anomaly(
            _anomaly(2, severity="warning")
        )
        == []
    )


def test_a_replay_notifies_alertmanager_and_audits_a_receiver_that_is_down(alertmanager: str, tmp_path: Path) -> None:
    settings = Settings()
    settings.notify = NotifySettings(
        alertmanager=[alertmanager, f"http://127.0.0.1:{free_port()}"], attempts=2, backoff_s=0.01
    )
    settings.audit_log = str(tmp_path / "audit.jsonl")
    result = replay(DEMO_DIR, settings=settings)
    sent = {a["labels"]["anomaly_id"] for a in _alerts(alertmanager)}
    open_critical = {a.anomaly_id for a in result.anomalies if a.severity != "info"} - {
        r.anomaly_id for r in result.resolutions
    }
    assert open_critical and open_critical <= sent
    failed = [e for e in read_entries(tmp_path / "audit.jsonl") if e["event"] == "notification_failed"]
    assert failed and {e["channel"] for e in failed} == {"alertmanager"}  # the receiver that is down, audited


class _Receiver(BaseHTTPRequestHandler):
    received: ClassVar[list[dict]] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        type(self).received.append(json.loads(body))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def webhook() -> Iterator[tuple[str, list[dict]]]:
    _Receiver.received = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Receiver)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"json://127.0.0.1:{server.server_address[1]}/hook", _Receiver.received
    finally:
        server.shutdown()


def test_apprise_messages_open_act_resolve_once_each_within_the_rate_limit(webhook: tuple[str, list[dict]]) -> None:
    url, received = webhook
    notifier = Notifier(NotifySettings(apprise=[url], max_per_minute=3))
    first = _anomaly(1)
    notifier.action(_action(first))  # an action that arrives before its anomaly goes out with it
    notifier.anomaly(first)
    notifier.anomaly(first)  # the same anomaly again (a re-delivered record): not a second message
    notifier.anomaly(_anomaly(1, resolved_at=time.time(), resolution="node returned to service"))
    titles = [m["title"] for m in received]
    assert titles == [
        "[critical] crash/xid_79 (hardware) on gpu-node-07, job 42",
        "[recommended] drain_node gpu-node-07 (monitor mode)",
        "[resolved] crash/xid_79 (hardware) on gpu-node-07, job 42",
    ]
    assert "Xid (PCI:0000:3b:00): 79" in received[0]["message"]
    (dropped,) = notifier.anomaly(_anomaly(2))  # the fourth message in a minute
    assert not dropped.ok and "max_per_minute" in dropped.detail and notifier.dropped == 1
    with pytest.raises(ValueError, match="apprise does not understand"):
        Notifier(NotifySettings(apprise=["nonsense"]))
