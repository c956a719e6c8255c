"""The console: auth, CSRF, headers and approvals over HTTP, then end to end in a real headless Chromium."""

from __future__ import annotations

import base64
import os
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest
from starlette.testclient import TestClient

from tests.conftest import DEMO_DIR, ROOT, replay
from tests.support.console import ALICE_SCRYPT, basic, console_settings, demo_inventory
from trainguard.actions.audit import AuditLog, read_entries
from trainguard.actions.drivers import DryRunDriver
from trainguard.actions.executor import ActionExecutor
from trainguard.actions.silences import Silences
from trainguard.console.app import create_app
from trainguard.console.data import ConsoleData
from trainguard.dataflows.config import Settings

ARTIFACTS = ROOT / "test-artifacts"


@pytest.fixture
def monitored(tmp_path: Path) -> tuple[Settings, Path]:
    """The demo replayed in monitor mode, its recommendations in an audit log."""
    audit = tmp_path / "audit.jsonl"
    settings = console_settings(audit)
    settings.policy.breaker.max_partition_fraction = 0.5
    replay(DEMO_DIR, settings=settings)
    return settings, audit


def client_for(settings: Settings, audit: Path, driver: DryRunDriver) -> TestClient:
    data = ConsoleData(audit, progress=DEMO_DIR)
    data.refresh()
    executor = ActionExecutor(settings.policy, driver, AuditLog(audit))
    return TestClient(create_app(settings, data, executor))


def test_scrypt_passwords_are_checked_once_then_remembered_without_keeping_them():
    from starlette.requests import Request

    from trainguard.console.app import Auth
    from trainguard.dataflows.config import ConsoleUser

    def request(user: str, password: str) -> Request:
        value = base64.b64encode(f"{user}:{password}".encode())
        return Request({"type": "http", "headers": [(b"authorization", b"Basic " + value)]})

    auth = Auth([ConsoleUser(name="alice", role="operator", password_scrypt=ALICE_SCRYPT)])
    assert auth.user(request("alice", "wrong")) is None and not auth._verified
    assert auth.user(request("alice", "alice-pw")).name == "alice"
    assert len(auth._verified) == 1 and all(b"alice-pw" not in seen for seen in auth._verified)
    assert auth.user(request("alice", "alice-pw")).name == "alice"  # from the cache
    assert auth.user(request("bob", "alice-pw")) is None


def test_auth_roles_csrf_and_headers(monitored: tuple[Settings, Path]):
    settings, audit = monitored
    driver = DryRunDriver(demo_inventory())
    with client_for(settings, audit, driver) as client:
        assert client.get("/healthz").status_code == 200
        assert client.get("/api/overview").status_code == 401
        assert client.get("/api/overview", headers=basic("alice", "wrong")).status_code == 401
        assert client.get("/api/overview", headers={"Authorization": "Bearer nope"}).status_code == 401
        robot = client.get("/api/overview", headers={"Authorization": "Bearer s3cret-token"})
        assert robot.status_code == 200 and robot.json()["pending"] == 4
        assert robot.json()["scheduler"] == {"jobs_running": 5, "nodes": 12, "nodes_unavailable": 0}
        for header, value in {
            "content-security-policy": "default-src 'self'",
            "x-frame-options": "DENY",
            "x-content-type-options": "nosniff",
        }.items():
            assert value in robot.headers[header]

        (drain,) = [
            a
            for a in client.get("/api/pending", headers=basic("victor", "victor-pw")).json()
            if a["target"] == "gpu-node-10"
        ]
        url = f"/api/actions/{drain['action_id']}/approve"
        viewer_csrf = client.get("/api/me", headers=basic("victor", "victor-pw")).json()["csrf"]
        refused = client.post(url, headers={**basic("victor", "victor-pw"), "X-CSRF-Token": viewer_csrf})
        assert refused.status_code == 403 and "operator" in refused.json()["error"]
        assert client.post(url, headers=basic("alice", "alice-pw")).status_code == 403  # no CSRF token
        wrong = client.post(url, headers={**basic("alice", "alice-pw"), "X-CSRF-Token": viewer_csrf})
        assert wrong.status_code == 403  # another user's token
        assert driver.commands == []
        assert not [e for e in read_entries(audit) if e["event"] in ("approved", "intent")]


def test_approve_and_reject_go_through_the_executor_and_the_audit(monitored: tuple[Settings, Path]):
    settings, audit = monitored
    driver = DryRunDriver(demo_inventory())
    with client_for(settings, audit, driver) as client:
        alice = basic("alice", "alice-pw")
        csrf = {**alice, "X-CSRF-Token": client.get("/api/me", headers=alice).json()["csrf"]}
        pending = {(a["action"], a["target"]): a for a in client.get("/api/pending", headers=alice).json()}
        drain = pending[("drain_node", "gpu-node-10")]
        done = client.post(f"/api/actions/{drain['action_id']}/approve", headers=csrf)
        assert done.status_code == 200 and done.json()["status"] == "applied"
        assert driver.commands == [("drain_node", "gpu-node-10", drain["reason"])]
        again = client.post(f"/api/actions/{drain['action_id']}/approve", headers=csrf)
        assert again.status_code == 409 and "not pending" in again.json()["error"]
        hang = pending[("requeue_job", "1003")]
        rejected = client.post(f"/api/actions/{hang['action_id']}/reject", headers=csrf, json={"reason": "eval phase"})
        assert rejected.json()["status"] == "rejected"
        entries = [e for e in read_entries(audit) if e.get("user") == "alice"]
        assert [(e["event"], e["target"]) for e in entries] == [
            ("approved", "gpu-node-10"),
            ("intent", "gpu-node-10"),
            ("applied", "gpu-node-10"),
            ("rejected", "1003"),
        ]
        assert "eval phase" in entries[-1]["reason"]
        left = {(a["action"], a["target"]) for a in client.get("/api/pending", headers=alice).json()}
        assert ("drain_node", "gpu-node-10") not in left and ("requeue_job", "1003") not in left


# ---------------------------------------------------------------- end to end, in a browser

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"


@pytest.fixture
def browser() -> Iterator[object]:
    if not Path(CHROMIUM).exists():
        if os.environ.get("TRAINGUARD_REQUIRE_BROWSER"):
            pytest.fail("Debian's chromium is not installed (apt-get install chromium)")
        pytest.skip("needs Debian's chromium (apt-get install chromium)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        b = pw.chromium.launch(
            executable_path=CHROMIUM,
            args=[
                "--no-sandbox",
                "--disable-gpu",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--no-first-run",
                "--disable-quic",
            ],
        )
        try:
            yield b
        finally:
            b.close()


def serve(app: object, port: int) -> tuple[threading.Thread, object]:
    import uvicorn

    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    return thread, server


def test_console_in_chromium_feed_updates_live_and_approval_is_audited(browser, tmp_path: Path):
    from tests.support.tansu import free_port

    audit = tmp_path / "audit.jsonl"
    settings = console_settings(audit)
    settings.policy.breaker.max_partition_fraction = 0.5
    data = ConsoleData(audit, progress=DEMO_DIR)
    driver = DryRunDriver(demo_inventory())
    executor_box: list[ActionExecutor] = []

    class LateExecutor:  # the console's executor reads the audit log once the replay has written it
        def __getattr__(self, name: str):
            if not executor_box:
                log = AuditLog(audit)
                store = Silences(tmp_path / "silences.jsonl", log)
                executor_box.append(ActionExecutor(settings.policy, driver, log, silences=store))
            return getattr(executor_box[0], name)

    port = free_port()
    thread, server = serve(create_app(settings, data, LateExecutor(), poll_s=0.2), port)  # type: ignore[arg-type]
    try:
        context = browser.new_context(http_credentials={"username": "alice", "password": "alice-pw"})
        page = context.new_page()
        page.goto(f"http://127.0.0.1:{port}/")
        page.wait_for_selector("#live:text('live')")
        assert page.locator("#feed li").count() == 0
        # A replay runs while the page is open: the feed fills in through server-sent events.
        replayer = threading.Thread(target=replay, args=(DEMO_DIR,), kwargs={"settings": settings, "speed": 2000.0})
        replayer.start()
        page.locator("#feed li").nth(4).wait_for(timeout=60_000)  # (the page's CSP forbids eval'd waits)
        replayer.join()
        page.wait_for_selector("#pending article >> text=gpu-node-10")
        assert "xid_79" in page.locator("#feed").inner_text()
        page.locator("#feed a.job", has_text="job 1004").first.click()  # the straggler: per-rank progress
        page.wait_for_selector("#job-title:has-text('job 1004')")
        page.locator("#job-chart canvas").wait_for(state="attached")  # uPlot, vendored
        assert page.url.endswith("#job/1004")
        assert "steps/s" in page.locator("#job-chart").inner_text()  # the axis and the legend say the unit
        assert int(page.locator("#job-chart").get_attribute("data-markers") or 0) >= 1
        assert page.locator("#job-lanes").get_attribute("data-nodes") == "2"  # a GPU lane per node of the job
        assert "gpu-node-08" in page.locator("#job-lanes").inner_text()
        page.locator("#feed a.job", has_text="job 1002").first.click()  # the crash: its log lines around it
        page.wait_for_selector("#job-events pre.log >> text=unspecified launch failure")
        assert int(page.locator("#job-chart").get_attribute("data-markers") or 0) == 1
        # One card per incident; a decision is confirmed in a dialog that names the node and every action.
        crash = page.locator("#pending article", has_text="xid_79")
        assert crash.locator("li[data-action]").count() == 2  # the drain and the requeue, together
        crash.get_by_role("button", name="Approve…").click()
        dialog = page.locator("#confirm")
        dialog.wait_for(state="visible")
        assert "gpu-node-04" in dialog.inner_text() and "requeue job 1002" in dialog.inner_text()
        dialog.get_by_role("button", name="Cancel").click()  # cancelled: nothing happens
        dialog.wait_for(state="hidden")
        card = page.locator("#pending article", has_text="gpu-node-10")
        card.get_by_role("button", name="Approve…").click()
        dialog.wait_for(state="visible")
        assert "node gpu-node-10" in dialog.inner_text()
        dialog.get_by_role("button", name="Confirm").click()
        page.wait_for_selector("#decision-result:has-text('applied')")
        # The cluster map: the lost GPU, the node just drained; a node's own page from its link.
        page.wait_for_selector("#cluster [data-node='gpu-node-10'] .gpu.drained")
        assert page.locator("#cluster [data-node='gpu-node-04'] .gpu.lost").count() == 1
        assert page.locator("#cluster .map-row").count() == 12
        page.locator("#cluster a.node", has_text="gpu-node-04").click()
        page.wait_for_selector("#node-title:has-text('gpu-node-04')")
        assert page.url.endswith("#node/gpu-node-04")
        assert page.locator("#node-gpus tbody tr").count() == 8
        assert "W" in page.locator("#node-gpus tbody tr").first.inner_text()  # its latest telemetry
        assert "gpu_lost" in page.locator("#node-events").inner_text()
        # The trend row: three charts over the range (uPlot canvases with their titles).
        page.wait_for_selector("#trend-anomalies canvas")
        assert "by kind" in page.locator("#trend-anomalies").inner_text()
        assert page.locator("#trend-detect canvas").count() == 1
        # The incident list: every anomaly, then filtered by kind and by node.
        page.wait_for_selector("#incidents-page:has-text('of 5')")
        page.locator("#incident-filters select[name=kind]").select_option("crash")
        page.wait_for_selector("#incidents-page:has-text('1–1 of 1')")
        assert "xid_79" in page.locator("#incidents tbody").inner_text()
        page.locator("#incident-filters select[name=kind]").select_option("")
        page.locator("#incident-filters input[name=node]").fill("gpu-node-04")
        page.locator("#incident-filters input[name=node]").press("Enter")
        page.wait_for_selector("#incidents-page:has-text('of 2')")  # the crash and the lost GPU
        page.wait_for_selector("#audit >> text=approved")
        # An operator silences a node for its RMA, then ends the silence early.
        form = page.locator("#silence-form")
        form.get_by_label("silence node").fill("gpu-node-04")
        form.get_by_label("silence duration").fill("4h")
        form.get_by_label("silence reason").fill("RMA 4711")
        form.get_by_role("button", name="Silence").click()
        page.wait_for_selector("#silences tr[data-silence] >> text=node gpu-node-04")
        page.wait_for_selector("#audit >> text=silence_added")
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "console.png"), full_page=True)
        for width, height in ((1440, 900), (1024, 768)):
            page.set_viewport_size({"width": width, "height": height})
            page.screenshot(path=str(ARTIFACTS / f"console-{width}x{height}.png"), full_page=True)
            wider = page.evaluate("() => document.documentElement.scrollWidth - document.documentElement.clientWidth")
            assert wider <= 0, f"the page is {wider}px wider than a {width}px window: something clips or scrolls"
        page.locator("#silences tr", has_text="gpu-node-04").get_by_role("button", name="Expire").click()
        page.wait_for_selector("#silence-result:has-text('expired')")
        page.wait_for_selector("#audit >> text=silence_expired")
        assert page.locator("#silences tr[data-silence]").count() == 0
        context.close()
    finally:
        server.should_exit = True  # type: ignore[attr-defined]
        thread.join(timeout=10)
    approved = [e for e in read_entries(audit) if e["event"] in ("approved", "applied") and e.get("user") == "alice"]
    assert [(e["event"], e["target"]) for e in approved] == [("approved", "gpu-node-10"), ("applied", "gpu-node-10")]
    assert driver.commands[0][:2] == ("drain_node", "gpu-node-10")
    changes = [(e["event"], e["user"], e["node"]) for e in read_entries(audit) if e["event"].startswith("silence_")]
    assert changes == [("silence_added", "alice", "gpu-node-04"), ("silence_expired", "alice", "gpu-node-04")]


def test_console_reads_anomalies_and_live_progress_from_kafka(tansu, tmp_path: Path):
    from confluent_kafka import Producer

    from trainguard.console.kafka_tail import KafkaTail
    from trainguard.dataflows.config import KafkaSettings
    from trainguard.dataflows.kafka_io import create_topics

    kafka = KafkaSettings(brokers=[tansu.address])
    create_topics(kafka)
    demo = replay(DEMO_DIR)
    producer = Producer({"bootstrap.servers": tansu.address})
    for a in demo.anomalies + demo.anomalies:  # at-least-once upstream: every anomaly twice
        producer.produce("anomalies", msgspec.json.encode(a))
    producer.flush(10)
    data = ConsoleData(None)
    tail = KafkaTail(kafka, data)
    try:
        time.sleep(1.0)  # the progress topic is read from its end: only what comes after the console starts
        now = time.time()
        for step in range(30):
            for rank in (0, 1):  # two ranks report each step: the timeline counts steps, not records
                record = {"ts": now + step, "job_id": "77", "node": "n1", "rank": rank, "step": step}
                producer.produce("progress", msgspec.json.encode(record))
        producer.produce("progress", b"{not json")
        producer.flush(10)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and (
            len(data.feed()) < len(demo.anomalies) or round(sum(n for _, n in data.progress.get("77", [])) * 10) < 30
        ):
            time.sleep(0.2)
    finally:
        tail.close()
    assert {a["anomaly_id"] for a in data.feed()} == {a.anomaly_id for a in demo.anomalies}
    assert len(data.feed()) == len(demo.anomalies)
    assert round(sum(n for _, n in data.job("77")["progress"]) * 10) == 30  # steps/s over 10 s buckets: 30 steps


def test_the_audit_trail_pages_and_says_what_ran(monitored: tuple[Settings, Path]):
    settings, audit = monitored
    client = client_for(settings, audit, DryRunDriver(demo_inventory()))
    headers = basic("alice", "alice-pw")
    everything = client.get("/api/audit?limit=500", headers=headers).json()
    assert everything["total"] == len(everything["rows"]) > 3
    first = client.get("/api/audit?limit=2", headers=headers).json()
    second = client.get("/api/audit?offset=2&limit=2", headers=headers).json()
    assert [r["recorded_at"] for r in first["rows"] + second["rows"]] == [
        r["recorded_at"] for r in everything["rows"][:4]
    ]  # newest first, pages without gaps or repeats
    assert all("driver" in r for r in everything["rows"])
    assert {r["driver"] for r in everything["rows"] if r["event"] == "recommended"} == {None}
    assert client.get("/api/audit?offset=x", headers=headers).status_code == 400


def test_the_incident_list_filters_pages_and_carries_each_anomalys_actions(monitored: tuple[Settings, Path]):
    settings, audit = monitored
    client = client_for(settings, audit, DryRunDriver(demo_inventory()))
    headers = basic("alice", "alice-pw")
    every = client.get("/api/incidents", headers=headers).json()
    assert every["total"] == len(every["rows"]) == 5 and {"crash", "hang", "straggler"} <= set(every["kinds"])
    crash = client.get("/api/incidents?kind=crash", headers=headers).json()["rows"]
    assert [a["category"] for a in crash] == ["xid_79"]
    assert {(x["action"], x["event"]) for x in crash[0]["actions"]} >= {("drain_node", "recommended")}
    node = client.get("/api/incidents?node=gpu-node-04", headers=headers).json()
    assert node["total"] == 2
    paged = client.get("/api/incidents?limit=2&offset=2", headers=headers).json()
    assert [a["anomaly_id"] for a in paged["rows"]] == [a["anomaly_id"] for a in every["rows"][2:4]]
    recent = client.get(f"/api/incidents?since={every['newest'] - 1}", headers=headers).json()
    assert recent["total"] == 1  # only the newest detection within one second of event time
    assert client.get("/api/incidents?status=maybe", headers=headers).status_code == 400
    cluster = client.get("/api/cluster", headers=headers).json()
    assert cluster["scheduler"] == {"driver": "dry-run"}  # the scheduler's word, where a driver gives it
    assert {row["scheduler_state"] for row in cluster["nodes"]} - {None}
    trends = client.get("/api/trends", headers=headers).json()
    assert sum(sum(v) for v in trends["anomalies"].values()) == 5 and len(trends["t"]) >= 1
    assert "recommended" in trends["actions"]
