"""Silences: what they match, that they end by themselves, and what a silenced anomaly still does."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest
from starlette.testclient import TestClient
from typer.testing import CliRunner

from tests.conftest import DEMO_DIR, replay
from tests.support.console import basic, console_settings, demo_inventory
from trainguard.actions.audit import AuditLog, read_entries
from trainguard.actions.drivers import DryRunDriver
from trainguard.actions.executor import ActionExecutor
from trainguard.actions.notify import Notifier, NotifySettings
from trainguard.actions.silences import SilenceError, Silences
from trainguard.cli.app import app
from trainguard.console.app import create_app
from trainguard.console.data import ConsoleData
from trainguard.dataflows.config import Settings
from trainguard.detectors.events import Anomaly

DEMO_START = datetime(2026, 12, 1, 10, 0, tzinfo=UTC).timestamp()  # the bundled scenario's first hour


def _anomaly(at: float, **kw) -> Anomaly:
    base = dict(anomaly_id="an-1", detected_at=at, kind="crash", category="xid_79", job_id="llm-7", nodes=["n7"])
    return Anomaly(**{**base, **kw})


@pytest.mark.parametrize(
    ("matchers", "covered"),
    [
        ({"node": "n7"}, True),
        ({"node": "n8"}, False),
        ({"job": "llm-*"}, True),
        ({"job": "eval-*"}, False),
        ({"kind": "crash", "node": "n7"}, True),
        ({"kind": "hang", "node": "n7"}, False),
        ({"partition": "gpu"}, True),
        ({"partition": "canary"}, False),
    ],
)
def test_a_silence_covers_what_all_its_matchers_match(tmp_path: Path, matchers: dict, covered: bool) -> None:
    store = Silences(tmp_path / "s.jsonl")
    store.add(duration_s=3600, reason="maintenance", by="alice", now=0.0, **matchers)
    assert (store.matching(_anomaly(100.0), partitions={"gpu"}) is not None) is covered


def test_a_silence_ends_by_itself_and_can_be_ended_early(tmp_path: Path) -> None:
    store = Silences(tmp_path / "s.jsonl")
    silence = store.add(node="n7", duration_s=3600, reason="RMA", by="alice", now=0.0)
    assert store.matching(_anomaly(3599.0)) == silence
    assert store.matching(_anomaly(3600.0)) is None  # expired: nothing to do
    assert store.matching(_anomaly(-1.0)) is None  # before it began
    store.expire(silence.silence_id, by="bob", now=600.0)
    assert store.matching(_anomaly(601.0)) is None and store.matching(_anomaly(599.0)) is not None
    assert Silences(tmp_path / "s.jsonl").all()[0].expired_by == "bob"  # another process reads the same file
    with pytest.raises(SilenceError, match="not in force"):
        store.expire(silence.silence_id, by="bob", now=700.0)
    with pytest.raises(SilenceError, match="at least one of"):
        store.add(duration_s=60, reason="x", by="a")


def test_a_silenced_anomaly_is_archived_but_neither_acted_on_nor_notified(tmp_path: Path) -> None:
    settings = Settings()
    settings.audit_log = str(tmp_path / "audit.jsonl")
    store = Silences(settings.silences_path, AuditLog(settings.audit_log))  # type: ignore[arg-type]
    silence = store.add(node="gpu-node-04", duration_s=2 * 3600, reason="RMA 4711", by="alice", now=DEMO_START)
    result = replay(DEMO_DIR, settings=settings)
    silenced = [a for a in result.anomalies if "gpu-node-04" in a.nodes]
    assert {a.category for a in silenced} == {"xid_79", "gpu_lost"}  # still detected and reported
    ids = {a.anomaly_id for a in silenced}
    theirs = [x for x in result.actions if x.anomaly_id in ids]
    assert theirs and all(x.status == "suppressed" for x in theirs)
    by_policy = [x for x in theirs if "cooldown" in x.reason]  # suppressed by the policy before any silence
    assert all(f"silenced by {silence.silence_id}" in x.reason for x in theirs if x not in by_policy)
    assert len(by_policy) < len(theirs)
    others = [x for x in result.actions if x.anomaly_id not in ids]
    assert any(x.status == "recommended" for x in others)  # the rest of the cluster is untouched
    notifier = Notifier(NotifySettings(apprise=["json://127.0.0.1:9/never"]), silences=store)
    assert all(not notifier.wants(a) for a in silenced)
    assert all(notifier.wants(a) for a in result.anomalies if a.anomaly_id not in ids and a.severity != "info")


def test_silences_from_the_cli_are_audited(tmp_path: Path) -> None:
    config = tmp_path / "tg.yaml"
    config.write_text(f"audit_log: {tmp_path / 'audit.jsonl'}\n")
    runner = CliRunner()
    added = runner.invoke(
        app, ["silence", "add", "--job", "llm-*", "--for", "2h", "--reason", "upgrade", "-c", str(config)]
    )
    assert added.exit_code == 0, added.output
    (listed,) = [
        json.loads(line)
        for line in runner.invoke(app, ["silence", "list", "--json", "-c", str(config)]).output.splitlines()
    ]
    assert listed["job"] == "llm-*" and listed["active"] and listed["ends_at"] - listed["starts_at"] == 7200
    assert runner.invoke(app, ["silence", "expire", listed["silence_id"], "-c", str(config)]).exit_code == 0
    assert runner.invoke(app, ["silence", "list", "-c", str(config)]).output.strip() == "no silences in force"
    events = [e["event"] for e in read_entries(tmp_path / "audit.jsonl")]
    assert events == ["silence_added", "silence_expired"]


def test_silences_over_http_need_an_operator_and_the_csrf_token(tmp_path: Path) -> None:
    audit = tmp_path / "audit.jsonl"
    settings = console_settings(audit)
    store = Silences(settings.silences_path, AuditLog(audit))  # type: ignore[arg-type]
    executor = ActionExecutor(settings.policy, DryRunDriver(demo_inventory()), AuditLog(audit), silences=store)
    client = TestClient(create_app(settings, ConsoleData(audit), executor))
    body = {"node": "gpu-node-07", "duration": "4h", "reason": "RMA"}
    viewer = basic("victor", "victor-pw")
    viewer_csrf = client.get("/api/me", headers=viewer).json()["csrf"]
    assert client.post("/api/silences", json=body, headers={**viewer, "X-CSRF-Token": viewer_csrf}).status_code == 403
    alice = basic("alice", "alice-pw")
    assert client.post("/api/silences", json=body, headers=alice).status_code == 403  # no CSRF token
    csrf = {**alice, "X-CSRF-Token": client.get("/api/me", headers=alice).json()["csrf"]}
    bad = client.post("/api/silences", json={**body, "duration": "soon"}, headers=csrf)
    assert bad.status_code == 400 and "not a duration" in bad.json()["error"]
    made = client.post("/api/silences", json=body, headers=csrf).json()
    assert made["created_by"] == "alice" and made["node"] == "gpu-node-07"
    (shown,) = client.get("/api/silences", headers=viewer).json()  # viewers see them
    assert shown["active"]
    assert client.post(f"/api/silences/{made['silence_id']}/expire", headers=csrf).status_code == 200
    assert client.post(f"/api/silences/{made['silence_id']}/expire", headers=csrf).status_code == 404
    assert [e["event"] for e in read_entries(audit)] == ["silence_added", "silence_expired"]


def test_a_garbled_silences_file_loses_only_its_garbled_lines(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    store = Silences(path)
    kept = store.add(node="n7", duration_s=3600, reason="RMA", by="alice", now=0.0)
    with open(path, "ab") as fh:  # a torn write, a record of another shape, text that is not JSON
        fh.write(b'{"silence_id": "si-x", "starts_at": "soon"}\n\x00\xffnot json\n{"silence_id": "si-torn", "starts')
    assert Silences(path).all() == [kept]
    assert Silences(path).matching(_anomaly(100.0)) == kept
    later = store.add(job="llm-*", duration_s=60, reason="upgrade", by="bob", now=0.0)  # after the torn line
    assert Silences(path).all() == [kept, later]
