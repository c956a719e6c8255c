"""``diagnose``: a confirmed hang asks its nodes for the ranks' stacks — read-only, so carried out in monitor mode,
audited once, rate-limited by the policy's cooldown, and never a scheduler command."""

from __future__ import annotations

from pathlib import Path

import msgspec

from trainguard.actions.audit import AuditLog, read_entries
from trainguard.actions.drivers import DryRunDriver, Inventory, NodeInfo
from trainguard.actions.executor import ActionExecutor
from trainguard.actions.policy import Policy, PolicyConfig
from trainguard.actions.records import Action
from trainguard.detectors.events import Anomaly


def _hang(anomaly_id: str = "an-h1", at: float = 1000.0, **changes: object) -> Anomaly:
    hang = Anomaly(anomaly_id=anomaly_id, detected_at=at, kind="hang", category="no_progress", job_id="4711")
    return msgspec.structs.replace(hang, **changes) if changes else hang


def test_a_confirmed_hang_asks_for_stacks_first_alongside_the_requeue() -> None:
    diagnose, requeue = Policy(PolicyConfig()).decide(_hang(nodes=["n2"]))
    assert (diagnose.action, diagnose.target, diagnose.params, diagnose.status) == (
        "diagnose",
        "4711",
        {"nodes": "n2"},
        "recommended",
    )
    assert requeue.action == "requeue_job"
    policy = Policy(PolicyConfig())
    crash = msgspec.structs.replace(_hang(), kind="crash", category="cuda_oom", layer="application")
    assert "diagnose" not in [a.action for a in policy.decide(crash)]
    assert policy.decide(_hang(severity="warning"))[0].action == "notify"  # only critical hangs
    assert "diagnose" not in [a.action for a in policy.decide(_hang("an-h9", job_id=None, nodes=["n2"]))]  # no job


def test_revisions_and_resolutions_decide_nothing_and_a_second_hang_is_rate_limited() -> None:
    policy = Policy(PolicyConfig())
    first = policy.decide(_hang())
    assert [a.action for a in first] == ["diagnose", "requeue_job"]
    assert policy.decide(_hang(revised_at=1030.0, ranks=[2], localisation="stacks")) == []
    assert policy.decide(_hang(resolved_at=1100.0, resolution="job ended (CANCELLED)")) == []
    again = policy.decide(_hang("an-h2", at=1100.0))  # another hang of the job within the cooldown
    assert [(a.action, a.status) for a in again] == [("diagnose", "suppressed"), ("requeue_job", "suppressed")]
    later = policy.decide(_hang("an-h3", at=2000.0))
    assert later[0].action == "diagnose" and later[0].status == "recommended"


def test_the_executor_applies_diagnose_in_monitor_mode_and_audits_it_once(tmp_path: Path) -> None:
    hang = _hang(nodes=["n2"])
    diagnose, requeue = Policy(PolicyConfig()).decide(hang)
    audit = tmp_path / "audit.jsonl"
    ex = ActionExecutor(PolicyConfig(), None, AuditLog(audit))  # monitor mode, no scheduler at all
    done = ex.execute(hang, diagnose)
    assert done is not None and (done.status, done.mode) == ("applied", "monitor") and done.applied_at is not None
    assert "read-only: applied in monitor mode" in done.reason
    assert ex.execute(hang, requeue).status == "recommended"  # what acts on the job still waits for enforce
    assert ex.execute(hang, diagnose) is None  # idempotent: the same anomaly never asks twice
    restarted = ActionExecutor(PolicyConfig(), None, AuditLog(audit))
    assert restarted.execute(hang, diagnose) is None  # not after a restart either
    entries = [e for e in read_entries(audit) if e.get("action_id") == diagnose.action_id]
    assert [(e["event"], e["mode"], e["params"]) for e in entries] == [("applied", "monitor", {"nodes": "n2"})]


def test_in_enforce_mode_the_driver_is_told_but_the_scheduler_is_not_called(tmp_path: Path) -> None:
    driver = DryRunDriver(Inventory(nodes={"n2": NodeInfo("n2", "allocated", ("gpu",))}))
    ex = ActionExecutor(PolicyConfig(mode="enforce"), driver, AuditLog(tmp_path / "audit.jsonl"))
    hang = _hang(nodes=["n2"])
    diagnose, _ = Policy(PolicyConfig()).decide(hang)
    done = ex.execute(hang, diagnose)
    assert (done.status, done.mode) == ("applied", "enforce")
    assert driver.commands == [("diagnose", "4711", "n2")]  # the dry run records the request; nothing else ran
    bad = Action(action_id="ac-x", anomaly_id="an-h1", decided_at=1.0, action="diagnose", target="4711; reboot")
    refused = ex.execute(hang, bad)
    assert refused.status == "failed" and "refused name '4711; reboot'" in refused.reason
