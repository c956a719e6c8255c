"""The action layer without a cluster: policy rules and budgets, executor modes, breaker, audit, drivers."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from types import SimpleNamespace as NS

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from trainguard.actions.audit import AuditLog, compact, query, read_entries
from trainguard.actions.commands import CommandFailed, CommandRunner
from trainguard.actions.drivers import DryRunDriver, Inventory, JobInfo, NodeInfo
from trainguard.actions.executor import ActionExecutor
from trainguard.actions.hostlist import HostlistError, expand
from trainguard.actions.kubernetes import TAINT_KEY, KubernetesDriver
from trainguard.actions.policy import Policy, PolicyConfig, RetryBudget, Rules, Scope
from trainguard.detectors.events import Anomaly


def anomaly(n: int = 1, **kw) -> Anomaly:
    base = dict(
        anomaly_id=f"an-{n}",
        detected_at=1000.0 + 1000 * n,
        kind="crash",
        category="xid_79",
        layer="hardware",
        transient=False,
        job_id="42",
        nodes=["gpu-node-02"],
        evidence=["gpu-node-02: NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus."],
    )
    base.update(kw)
    return Anomaly(**base)


def inventory(nodes: int = 10, drained: tuple[str, ...] = ()) -> Inventory:
    names = [f"gpu-node-{i:02d}" for i in range(1, nodes + 1)]
    return Inventory(
        nodes={n: NodeInfo(n, "mixed", ("gpu",) if n != names[-1] else ("gpu", "canary"), n in drained) for n in names},
        jobs={
            "42": JobInfo("42", "llm-pretrain", "RUNNING", "gpu", tuple(names[:4])),
            "43": JobInfo("43", "eval-7b", "RUNNING", "canary", (names[-1],)),
        },
    )


def decide_all(policy: Policy, *anomalies: Anomaly) -> list[tuple[str, str, str]]:
    return [(x.action, x.target, x.status) for a in anomalies for x in policy.decide(a)]


# ---------------------------------------------------------------- policy


def test_rules_per_layer():
    policy = Policy(PolicyConfig())
    assert decide_all(policy, anomaly(1)) == [
        ("drain_node", "gpu-node-02", "recommended"),
        ("requeue_job", "42", "recommended"),
    ]
    nccl = anomaly(2, category="nccl_timeout", layer="system", transient=True, nodes=[], job_id="7")
    assert decide_all(policy, nccl) == [("requeue_job", "7", "recommended")]
    app = anomaly(3, category="python_exception", layer="application", transient=False, job_id="8")
    assert decide_all(policy, app) == [("hold_job", "8", "recommended"), ("notify", "8", "recommended")]
    idle_node = anomaly(4, kind="node_unhealthy", category="ecc_dbe", job_id=None, nodes=["gpu-node-09"])
    assert decide_all(policy, idle_node) == [("drain_node", "gpu-node-09", "recommended")]
    slow = anomaly(5, kind="straggler", category="slow_rank", job_id="9", nodes=["gpu-node-05"])
    assert decide_all(policy, slow) == [("notify", "9", "recommended")]


def test_rules_follow_the_config():
    policy = Policy(PolicyConfig(rules=Rules(application="cancel", straggler="drain_requeue")))
    app = anomaly(1, category="python_exception", layer="application", job_id="8")
    assert decide_all(policy, app)[0] == ("cancel_job", "8", "recommended")
    slow = anomaly(2, kind="straggler", category="slow_rank", job_id="9", nodes=["gpu-node-05"], transient=False)
    assert decide_all(policy, slow) == [
        ("drain_node", "gpu-node-05", "recommended"),
        ("requeue_job", "9", "recommended"),
    ]
    passing = anomaly(3, kind="straggler", category="slow_rank", job_id="10", nodes=["gpu-node-06"], transient=True)
    assert decide_all(policy, passing) == [("notify", "10", "recommended")]


def test_retry_budget_per_job_and_per_root_cause():
    policy = Policy(
        PolicyConfig(retry=RetryBudget(max_requeues_per_job=3, max_requeues_per_root_cause=2, cooldown_s=0))
    )
    nccl = [anomaly(i, category="nccl_timeout", layer="system", transient=True, nodes=[]) for i in range(1, 4)]
    statuses = [s for _, _, s in decide_all(policy, *nccl)]
    assert statuses == ["recommended", "recommended", "suppressed"]  # the same cause twice is enough
    ib = anomaly(5, category="ib_link", layer="system", transient=True, nodes=[])
    assert decide_all(policy, ib) == [("requeue_job", "42", "recommended")]  # another cause: third requeue
    again = anomaly(6, category="ib_down", layer="system", transient=True, nodes=[])
    (action,) = policy.decide(again)
    assert action.status == "suppressed" and "job 42 requeued 3 times" in action.reason


# ---------------------------------------------------------------- executor


def test_monitor_mode_changes_nothing_and_says_so(tmp_path: Path):
    driver = DryRunDriver(inventory())
    ex = ActionExecutor(PolicyConfig(), driver, AuditLog(tmp_path / "audit.jsonl"))
    done = [ex.execute(anomaly(1), x) for x in Policy(PolicyConfig()).decide(anomaly(1))]
    assert [(a.status, a.mode) for a in done] == [("recommended", "monitor")] * 2
    assert driver.commands == []
    assert [e["event"] for e in read_entries(tmp_path / "audit.jsonl")] == ["recommended", "recommended"]


class _NoScheduler(DryRunDriver):
    """A driver whose scheduler cannot be reached (no ``sinfo`` on this host)."""

    def inventory(self) -> Inventory:
        raise CommandFailed("sinfo: command not found", ())


def test_monitor_mode_recommends_without_a_reachable_scheduler(tmp_path: Path):
    ex = ActionExecutor(PolicyConfig(), _NoScheduler(inventory()), AuditLog(tmp_path / "audit.jsonl"))
    done = [ex.execute(anomaly(1), x) for x in Policy(PolicyConfig()).decide(anomaly(1))]
    assert [(a.action, a.status, a.mode) for a in done] == [
        ("drain_node", "recommended", "monitor"),
        ("requeue_job", "recommended", "monitor"),
    ]
    # Enforce only for a partition it cannot look up now: the rest is still recommended, and says
    # that the scheduler's inventory was not checked.
    config = msgspec.convert({"scopes": [{"partition": "canary", "mode": "enforce"}]}, PolicyConfig)
    ex = ActionExecutor(config, _NoScheduler(inventory()))
    done = [ex.execute(anomaly(2), x) for x in Policy(config).decide(anomaly(2))]
    assert {a.status for a in done} == {"recommended"}
    assert all("scheduler inventory not checked: sinfo: command not found" in a.reason for a in done)
    # Enforcing needs the inventory: that is what fails, with the reason.
    config = PolicyConfig(mode="enforce")
    done = [
        ActionExecutor(config, _NoScheduler(inventory())).execute(anomaly(3), x)
        for x in Policy(config).decide(anomaly(3))
    ]
    assert {a.status for a in done} == {"failed"} and all(
        "cannot read the scheduler inventory" in a.reason for a in done
    )


def test_modes_per_scope_canary_partition_first():
    config = msgspec.convert(
        {"scopes": [{"partition": "canary", "mode": "enforce"}], "breaker": {"max_partition_fraction": 1.0}},
        PolicyConfig,
    )
    driver = DryRunDriver(inventory())
    ex = ActionExecutor(config, driver)
    policy = Policy(config)
    on_gpu = [ex.execute(anomaly(1), x) for x in policy.decide(anomaly(1))]
    canary = anomaly(2, job_id="43", nodes=["gpu-node-10"])
    on_canary = [ex.execute(canary, x) for x in policy.decide(canary)]
    assert {a.status for a in on_gpu} == {"recommended"}
    assert [(a.action, a.status) for a in on_canary] == [("drain_node", "applied"), ("requeue_job", "applied")]
    assert driver.commands == [
        ("drain_node", "gpu-node-10", canary_reason(canary)),
        ("requeue_job", "43", "gpu-node-10"),
    ]


def canary_reason(a: Anomaly) -> str:
    return f"trainguard: {a.kind}/{a.category} ({a.anomaly_id})"


def test_job_pattern_scope_matches_names_from_the_inventory():
    config = PolicyConfig(mode="enforce", scopes=[Scope(job="llm-*", mode="monitor")])
    ex = ActionExecutor(config, DryRunDriver(inventory()))
    (drain, requeue) = [ex.execute(anomaly(1), x) for x in Policy(config).decide(anomaly(1))]
    assert drain.status == requeue.status == "recommended"  # job 42 is "llm-pretrain"


@pytest.mark.parametrize(
    "name", ["gpu-node-01; rm -rf /", "$(touch /tmp/pwned)", "gpu-node-01\nreason=x", "-gpu-node-01", "ghost-node"]
)
def test_names_not_in_the_inventory_never_reach_a_command(name: str):
    driver = DryRunDriver(inventory())
    ex = ActionExecutor(PolicyConfig(mode="enforce"), driver)
    bad = anomaly(1, nodes=[name], job_id=name)
    done = [ex.execute(bad, x) for x in Policy(PolicyConfig()).decide(bad)]
    assert [a.status for a in done] == ["failed", "failed"]
    assert all("not in the scheduler's inventory" in a.reason for a in done)
    assert driver.commands == []


def test_draining_a_drained_node_is_a_no_op():
    driver = DryRunDriver(inventory(drained=("gpu-node-02",)))
    ex = ActionExecutor(PolicyConfig(mode="enforce"), driver)
    (drain, _requeue) = [ex.execute(anomaly(1), x) for x in Policy(PolicyConfig()).decide(anomaly(1))]
    assert drain.status == "applied" and "already drained" in drain.reason
    assert driver.commands == [("requeue_job", "42", "gpu-node-02")]


def test_circuit_breaker_stops_a_storm_and_audits_its_state(tmp_path: Path):
    inv = inventory(nodes=10)
    driver = DryRunDriver(inv)
    config = PolicyConfig(mode="enforce")  # 10 % of 10 nodes: one drain
    ex = ActionExecutor(config, driver, AuditLog(tmp_path / "audit.jsonl"))
    policy = Policy(config)
    storm = [anomaly(i, kind="node_unhealthy", job_id=None, nodes=[f"gpu-node-0{i}"]) for i in range(1, 5)]
    results = []
    for a in storm:
        for x in policy.decide(a):
            done = ex.execute(a, x)
            results.append(done)
            if done.status == "applied":  # the dry run changes nothing: let the inventory say what happened
                inv.nodes[x.target] = NodeInfo(x.target, "mixed", ("gpu",), drained=True)
    assert [a.status for a in results] == ["applied", "recommended", "recommended", "recommended"]
    assert all("circuit breaker open" in a.reason for a in results[1:])
    assert len(driver.commands) == 1 and ex.breaker.is_open
    breaker = [e for e in read_entries(tmp_path / "audit.jsonl") if e["event"] == "breaker"]
    assert len(breaker) == 1 and breaker[0]["open"] and "2/10 nodes of partition gpu" in breaker[0]["reason"]


def test_drains_per_hour_survive_a_restart(tmp_path: Path):
    config = msgspec.convert(
        {"mode": "enforce", "breaker": {"max_partition_fraction": 1.0, "max_drains_per_hour": 2}}, PolicyConfig
    )
    audit = tmp_path / "audit.jsonl"
    clock = iter(range(100, 10_000, 10)).__next__
    ex = ActionExecutor(config, DryRunDriver(inventory()), AuditLog(audit), clock=lambda: float(clock()))
    for i in (1, 2):
        a = anomaly(i, kind="node_unhealthy", job_id=None, nodes=[f"gpu-node-0{i}"])
        assert [ex.execute(a, x).status for x in Policy(config).decide(a)] == ["applied"]
    restarted = ActionExecutor(config, DryRunDriver(inventory()), AuditLog(audit), clock=lambda: 200.0)
    a = anomaly(3, kind="node_unhealthy", job_id=None, nodes=["gpu-node-03"])
    (third,) = [restarted.execute(a, x) for x in Policy(config).decide(a)]
    assert third.status == "recommended" and "2 drains in the last hour" in third.reason


def test_a_crash_between_intent_and_outcome_is_reconciled_once(tmp_path: Path):
    audit = tmp_path / "audit.jsonl"
    config = PolicyConfig(mode="enforce")
    inv = inventory()

    class DiesMidCommand(DryRunDriver):
        def drain_node(self, node: str, reason: str):
            raise SystemExit("killed")  # the process dies after the intent is on disk

    with pytest.raises(SystemExit):
        ActionExecutor(config, DiesMidCommand(inv), AuditLog(audit)).execute(
            anomaly(1), Policy(config).decide(anomaly(1))[0]
        )
    assert [e["event"] for e in read_entries(audit)] == ["intent"]

    driver = DryRunDriver(inv)
    restarted = ActionExecutor(config, driver, AuditLog(audit))
    assert restarted.unreconciled == 1
    (done,) = restarted.reconcile()
    assert done.status == "applied" and driver.commands[0][:2] == ("drain_node", "gpu-node-02")
    # The flow replays the same decision after the restart: nothing runs twice.
    assert restarted.execute(anomaly(1), Policy(config).decide(anomaly(1))[0]) is None
    assert len(driver.commands) == 1

    # Had the command taken effect before the crash, reconciliation only records it.
    audit2 = tmp_path / "audit2.jsonl"
    with pytest.raises(SystemExit):
        ActionExecutor(config, DiesMidCommand(inv), AuditLog(audit2)).execute(
            anomaly(1), Policy(config).decide(anomaly(1))[0]
        )
    inv.nodes["gpu-node-02"] = NodeInfo("gpu-node-02", "mixed", ("gpu",), drained=True)
    driver = DryRunDriver(inv)
    (done,) = ActionExecutor(config, driver, AuditLog(audit2)).reconcile()
    assert done.status == "applied" and "reconciled" in done.reason and driver.commands == []


def test_failed_commands_are_audited_with_every_attempt(tmp_path: Path):
    runner = CommandRunner(timeout_s=5, attempts=3, backoff_s=0.0)
    with pytest.raises(CommandFailed) as info:
        runner.run(["false"])
    assert len(info.value.attempts) == 3 and not any(a.ok for a in info.value.attempts)
    slow = CommandRunner(timeout_s=0.2, attempts=2, backoff_s=0.0)
    with pytest.raises(CommandFailed, match="timed out"):
        slow.run(["sleep", "5"])


def test_ssh_quotes_every_argument_for_the_remote_shell():
    argv = CommandRunner(ssh_host="slurm-head").argv_for(["scontrol", "update", "reason=a b; rm -rf /"])
    assert argv[:5] == ["ssh", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes"]
    assert argv[-1] == "scontrol update 'reason=a b; rm -rf /'"


# ---------------------------------------------------------------- audit queries


def test_audit_query_and_compaction(tmp_path: Path):
    audit = tmp_path / "audit.jsonl"
    config = PolicyConfig(mode="enforce")
    ex = ActionExecutor(config, DryRunDriver(inventory()), AuditLog(audit))
    for i, node in ((1, "gpu-node-02"), (2, "gpu-node-05")):
        a = anomaly(i, job_id=str(41 + i), nodes=[node])
        for x in Policy(config).decide(a):
            ex.execute(a, x)
    with open(audit, "ab") as fh:
        fh.write(b'{"event": "intent", "action_id": "torn')  # a crash mid-write
    assert query(audit).height == 8  # intent + applied per executed action
    assert set(query(audit, node="gpu-node-05")["job_id"]) == {"43"}
    assert query(audit, job="42")["action"].to_list() == ["drain_node", "drain_node", "requeue_job", "requeue_job"]
    assert compact(audit, tmp_path / "audit.parquet") == 8
    import polars as pl

    assert pl.read_parquet(tmp_path / "audit.parquet").filter(pl.col("event") == "applied").height == 4
    # The next process appends after the torn line, on a line of its own: nothing more is lost.
    AuditLog(audit).append({"event": "breaker", "open": False, "recorded_at": 1.0})
    assert query(audit).height == 9


# ---------------------------------------------------------------- drivers


def test_hostlists():
    assert expand("gpu-node-[01-03,07],login1") == [
        "gpu-node-01",
        "gpu-node-02",
        "gpu-node-03",
        "gpu-node-07",
        "login1",
    ]
    assert expand("n[8-10]") == ["n8", "n9", "n10"]
    for bad in ("n[1-", "n[3-1]", "n]1[", "n[a-b]"):
        with pytest.raises(HostlistError):
            expand(bad)


@given(st.text(max_size=40))
def test_hostlist_expansion_never_crashes_otherwise(text: str):
    with contextlib.suppress(HostlistError):
        expand(text)


class FakeCore:
    def __init__(self) -> None:
        self.calls: list[tuple] = []
        self.node = NS(
            metadata=NS(name="gpu-node-01", labels={"trainguard.io/partition": "gpu"}, annotations={}),
            spec=NS(unschedulable=False, taints=[NS(key="nvidia.com/gpu", value="present", effect="NoSchedule")]),
            status=NS(conditions=[NS(type="Ready", status="True")]),
        )

    def list_node(self):
        return NS(items=[self.node])

    def read_node(self, name):
        return self.node

    def patch_node(self, name, body):
        self.calls.append(("patch_node", name, body))

    def list_namespaced_pod(self, namespace):
        pod = NS(metadata=NS(labels={"job-name": "train-1"}), spec=NS(node_name="gpu-node-01"))
        return NS(items=[pod])

    def delete_collection_namespaced_pod(self, namespace, label_selector):
        self.calls.append(("delete_pods", namespace, label_selector))


class FakeBatch:
    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def list_namespaced_job(self, namespace):
        job = NS(
            metadata=NS(name="train-1", labels={}), spec=NS(suspend=False), status=NS(active=2, succeeded=0, failed=1)
        )
        return NS(items=[job])

    def patch_namespaced_job(self, name, namespace, body):
        self.calls.append(("patch_job", name, body))


def test_kubernetes_driver_cordons_taints_and_restarts_pods():
    core, batch = FakeCore(), FakeBatch()
    driver = KubernetesDriver(core, batch, namespace="ml", attempts=1)
    inv = driver.inventory()
    assert inv.nodes["gpu-node-01"].partitions == ("gpu",) and not inv.nodes["gpu-node-01"].drained
    assert inv.jobs["train-1"].nodes == ("gpu-node-01",) and inv.jobs["train-1"].restarts == 1
    driver.drain_node("gpu-node-01", "trainguard: crash/xid_79 (an-1)")
    (_, _, body) = core.calls[-1]
    assert body["spec"]["unschedulable"] is True
    taints = {t["key"]: t["value"] for t in body["spec"]["taints"]}
    assert taints["nvidia.com/gpu"] == "present" and taints[TAINT_KEY] == "trainguard_crash_xid_79_an-1"
    driver.requeue_job("train-1", ["gpu-node-01"])
    assert core.calls[-1] == ("delete_pods", "ml", "job-name=train-1")
    driver.hold_job("train-1")
    assert batch.calls[-1] == ("patch_job", "train-1", {"spec": {"suspend": True}})


def test_kubernetes_api_errors_are_retried_then_reported():
    core = FakeCore()

    def broken(name, body):
        raise RuntimeError("503 Service Unavailable")

    core.patch_node = broken
    driver = KubernetesDriver(core, FakeBatch(), attempts=2, backoff_s=0.0)
    with pytest.raises(CommandFailed) as info:
        driver.drain_node("gpu-node-01", "x")
    assert [a.ok for a in info.value.attempts] == [False, False] and "503" in str(info.value)


def test_audit_entries_are_json_lines():
    assert json.loads(msgspec.json.encode({"a": 1})) == {"a": 1}


def test_an_intent_stays_open_while_the_scheduler_cannot_be_asked(tmp_path: Path):
    audit = tmp_path / "audit.jsonl"
    config = PolicyConfig(mode="enforce")

    class DiesMidCommand(DryRunDriver):
        def requeue_job(self, job_id: str, exclude: list[str]):
            raise SystemExit("killed")

    requeue = Policy(config).decide(anomaly(1))[1]
    with pytest.raises(SystemExit):
        ActionExecutor(config, DiesMidCommand(inventory()), AuditLog(audit)).execute(anomaly(1), requeue)

    class Unreachable(DryRunDriver):
        def inventory(self) -> Inventory:
            raise CommandFailed("squeue --json failed after 3 attempt(s): connection refused", ())

    down = Unreachable(inventory())
    restarted = ActionExecutor(config, down, AuditLog(audit))
    assert restarted.reconcile() == [] and restarted.unreconciled == 1
    assert restarted.execute(anomaly(1), requeue) is None  # never run twice while its fate is unknown
    assert down.commands == []
