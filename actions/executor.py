"""The action sink: mode per scope, inventory check, circuit breaker, idempotency, audit, execution.

Monitor → quarantine → drain → remediate, as NVSentinel separates them: the
policy has decided; here each decision is either published as a recommendation
(monitor mode, or the breaker is open) or carried out by the scheduler driver,
with an ``intent`` entry fsynced before the command and the outcome after. On
start, intents without an outcome (the process died in between) are reconciled
against the scheduler's real state: finished if the scheduler shows the effect,
carried out now otherwise — never repeated, never lost.

>>> from trainguard.actions.drivers import DryRunDriver, Inventory, NodeInfo
>>> from trainguard.actions.policy import PolicyConfig
>>> from trainguard.detectors.events import Anomaly
>>> from trainguard.actions.records import Action
>>> inv = Inventory(nodes={f"n{i}": NodeInfo(f"n{i}", "idle", ("gpu",)) for i in range(20)})
>>> driver = DryRunDriver(inv)
>>> ex = ActionExecutor(PolicyConfig(mode="enforce"), driver)
>>> anomaly = Anomaly(anomaly_id="an-1", detected_at=5.0, kind="node_unhealthy", category="xid_79",
...                   layer="hardware", nodes=["n3"])
>>> drain = Action(action_id="ac-1", anomaly_id="an-1", decided_at=5.0, action="drain_node", target="n3")
>>> done = ex.execute(anomaly, drain)
>>> (done.status, done.mode, driver.commands)
('applied', 'enforce', [('drain_node', 'n3', '')])
>>> ex.execute(anomaly, drain) is None  # the same action again: already done
True
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import msgspec

from trainguard.actions.audit import AuditLog, read_entries
from trainguard.actions.breaker import CircuitBreaker
from trainguard.actions.checks import already_done, invalid_target, mode_for, partitions_of, shows_effect
from trainguard.actions.commands import Attempt, CommandFailed
from trainguard.actions.drivers import SAFE_JOB, SAFE_NODE, Inventory, SchedulerDriver, clean_reason
from trainguard.actions.policy import Mode, PolicyConfig
from trainguard.actions.records import Action
from trainguard.actions.silences import Silence, Silences
from trainguard.detectors.events import Anomaly

TERMINAL_EVENTS = ("recommended", "applied", "failed", "suppressed", "rejected")


class ApprovalError(ValueError):
    """An approval or rejection that cannot be done; the message says why."""


class ActionExecutor:
    """Carries out (or publishes) decided actions; one instance per cluster, fed in order."""

    def __init__(
        self,
        config: PolicyConfig,
        driver: SchedulerDriver | None = None,
        audit: AuditLog | None = None,
        *,
        inventory_ttl_s: float = 1.0,
        clock: Callable[[], float] = time.time,
        silences: Silences | None = None,
    ) -> None:
        self.config = config
        self.silences = silences
        self.driver = driver
        self.audit = audit
        self.clock = clock
        self.inventory_ttl_s = inventory_ttl_s
        self.breaker = CircuitBreaker(config.breaker.max_partition_fraction, config.breaker.max_drains_per_hour)
        self._outcomes: dict[str, str] = {}  # action id -> its last terminal audit event
        self._open_intents: dict[str, dict[str, Any]] = {}
        self._inventory: tuple[float, Inventory] | None = None
        if audit is not None:
            self._load(audit)

    # ------------------------------------------------------------ restart

    def _load(self, audit: AuditLog) -> None:
        for entry in read_entries(audit.path):
            event, key = entry.get("event"), entry.get("action_id")
            if event == "intent":
                self._open_intents[key] = entry
            elif event in TERMINAL_EVENTS:
                self._outcomes[key] = event
                self._open_intents.pop(key, None)
                if event == "applied" and entry.get("action") == "drain_node" and not entry.get("noop"):
                    self.breaker.record_drain(entry.get("recorded_at") or 0.0)

    @property
    def unreconciled(self) -> int:
        return len(self._open_intents)

    def reconcile(self) -> list[Action]:
        """Finish every intent left without an outcome by a crash; returns the finished actions."""
        out = []
        for key, entry in list(self._open_intents.items()):
            anomaly = msgspec.convert(entry["anomaly"], Anomaly)
            action = msgspec.convert(entry["action_record"], Action)
            try:
                effective = self.driver is not None and shows_effect(action, entry, self.inventory(fresh=True))
            except CommandFailed:
                continue  # the scheduler cannot say: the intent stays open (and blocks a rerun) until it can
            del self._open_intents[key]
            if effective:
                out.append(self._finish(anomaly, action, "applied", "reconciled: the scheduler shows it done", ()))
            else:
                out.append(self._run(anomaly, action, reconciled=True))
        return out

    # ------------------------------------------------------------ the sink

    def inventory(self, fresh: bool = False) -> Inventory:
        assert self.driver is not None
        now = time.monotonic()
        if fresh or self._inventory is None or now - self._inventory[0] > self.inventory_ttl_s:
            self._inventory = (now, self.driver.inventory())
        return self._inventory[1]

    def execute(self, anomaly: Anomaly, action: Action) -> Action | None:
        """The action as carried out, recommended, suppressed or failed; ``None`` if it was done before."""
        if action.action_id in self._outcomes or action.action_id in self._open_intents:
            return None
        if action.status == "suppressed":
            return self._finish(anomaly, action, "suppressed", action.reason, ())
        silence = self._silence_for(anomaly)
        if silence is not None:
            reason = f"{action.reason}; silenced by {silence.describe()}"
            return self._finish(anomaly, action, "suppressed", reason, (), mode_for(self.config, action, anomaly, None))
        if action.action == "diagnose":
            return self._diagnose(anomaly, action)
        if self.driver is None:
            mode = mode_for(self.config, action, anomaly, None)
            if mode == "enforce":
                return self._finish(
                    anomaly, action, "recommended", f"{action.reason}; no scheduler driver configured", (), mode
                )
            return self._finish(anomaly, action, "recommended", action.reason, (), mode)
        if not self.config.may_enforce:
            # Monitor mode everywhere: a recommendation needs nothing from the scheduler.
            return self._finish(anomaly, action, "recommended", action.reason, (), "monitor")
        try:
            inventory = self.inventory()
        except CommandFailed as exc:
            # Which scope covers the action may depend on partitions we cannot read now; a
            # recommendation is still published, saying what could not be checked.
            mode = mode_for(self.config, action, anomaly, None)
            if mode == "monitor":
                reason = f"{action.reason}; scheduler inventory not checked: {exc}"
                return self._finish(anomaly, action, "recommended", reason, exc.attempts, mode)
            return self._finish(
                anomaly, action, "failed", f"cannot read the scheduler inventory: {exc}", exc.attempts, mode
            )
        mode = mode_for(self.config, action, anomaly, inventory)
        if mode == "monitor":
            return self._finish(anomaly, action, "recommended", action.reason, (), mode)
        return self._run(anomaly, action, inventory=inventory)

    def _diagnose(self, anomaly: Anomaly, action: Action) -> Action:
        """A stack dump request: it only reads, so it is carried out in monitor mode too. Publishing the
        applied action on the actions topic is the request (``collect-stacks`` answers it); a driver may add
        its own way to reach the nodes, and none calls the scheduler for it."""
        mode = mode_for(self.config, action, anomaly, None)
        nodes = [n for n in action.params.get("nodes", "").split(",") if n]
        # Names from telemetry: they reach every agent, which compares them with its processes' environment.
        bad = (
            action.target
            if not SAFE_JOB.match(action.target)
            else next((n for n in nodes if not SAFE_NODE.match(n)), None)
        )
        if bad is not None:
            return self._finish(anomaly, action, "failed", f"{action.reason}; refused name {bad!r}", (), mode)
        diagnose = getattr(self.driver, "diagnose", None)
        try:
            attempts = diagnose(action.target, nodes) if diagnose is not None else ()
        except CommandFailed as exc:
            return self._finish(anomaly, action, "failed", f"{action.reason}; {exc}", exc.attempts, mode)
        reason = f"{action.reason}; requested from the nodes' collect-stacks agents (read-only: applied in {mode} mode)"
        return self._finish(anomaly, action, "applied", reason, attempts, mode)

    def _silence_for(self, anomaly: Anomaly) -> Silence | None:
        if self.silences is None:
            return None
        # Partitions are known only once the scheduler was read.
        known = self._inventory
        partitions = partitions_of(known[1], anomaly.nodes, anomaly.job_id) if known is not None else set()
        return self.silences.matching(anomaly, partitions)

    def approve(self, anomaly: Anomaly, action: Action, user: str) -> Action:
        """Carry out a recommendation an operator approved, through the same checks as enforce mode."""
        self._check_pending(action)
        if self.driver is None:
            raise ApprovalError("no scheduler driver is configured, so nothing can be carried out")
        self._audit({**self._entry("approved", anomaly, action, "enforce", action.reason), "user": user})
        return self._run(anomaly, action, user=user)

    def reject(self, anomaly: Anomaly, action: Action, user: str, why: str) -> Action:
        """Record that an operator turned a recommendation down, and why."""
        self._check_pending(action)
        reason = f"{action.reason}; rejected by {user}: {clean_reason(why) or 'no reason given'}"
        return self._finish(anomaly, action, "rejected", reason, (), action.mode, user=user)

    def status_of(self, action_id: str) -> str | None:
        return self._outcomes.get(action_id)

    def _check_pending(self, action: Action) -> None:
        outcome = self._outcomes.get(action.action_id)
        if action.action_id in self._open_intents or outcome not in ("recommended", None):
            raise ApprovalError(f"action {action.action_id} is not pending (it is {outcome or 'in progress'})")

    # ------------------------------------------------------------ enforce

    def _run(
        self,
        anomaly: Anomaly,
        action: Action,
        inventory: Inventory | None = None,
        reconciled: bool = False,
        user: str | None = None,
    ) -> Action:
        """Carry out one action in enforce mode; ``user`` is the operator who approved it, if any."""

        def done(status: str, reason: str, attempts: tuple[Attempt, ...] = (), noop: bool = False) -> Action:
            return self._finish(anomaly, action, status, reason, attempts, "enforce", noop=noop, user=user)

        if action.action == "notify":
            return done("applied", action.reason)
        try:
            inventory = inventory or self.inventory()
        except CommandFailed as exc:
            return done("failed", f"cannot read the scheduler inventory: {exc}", exc.attempts)
        problem = invalid_target(action, inventory)
        if problem is not None:
            return done("failed", problem)
        noop = already_done(action, inventory)
        if noop is not None:
            return done("applied", noop, noop=True)
        if action.action == "drain_node":
            why = self.breaker.check(action.target, inventory, self.clock())
            if self.breaker.update(why):
                self._audit({"event": "breaker", "open": why is not None, "reason": why, "recorded_at": self.clock()})
            if why is not None:
                return done("recommended", f"{action.reason}; circuit breaker open: {why}")
        job = inventory.jobs.get(action.target)
        intent = self._entry("intent", anomaly, action, "enforce", action.reason)
        intent["anomaly"] = msgspec.structs.asdict(anomaly)
        intent["action_record"] = msgspec.structs.asdict(action)
        intent["restarts_before"] = job.restarts if job is not None else None
        intent["reconciled"] = reconciled
        intent["user"] = user
        self._audit(intent)
        self._open_intents[action.action_id] = intent
        try:
            attempts = self._call(action)
        except CommandFailed as exc:
            self._open_intents.pop(action.action_id, None)
            return done("failed", f"{action.reason}; {exc}", exc.attempts)
        self._open_intents.pop(action.action_id, None)
        self._inventory = None  # the scheduler's state just changed
        if action.action == "drain_node":
            self.breaker.record_drain(self.clock())
        return done("applied", action.reason, attempts)

    def _call(self, action: Action) -> tuple[Attempt, ...]:
        assert self.driver is not None
        d, target = self.driver, action.target
        match action.action:
            case "drain_node":
                return d.drain_node(target, clean_reason(action.reason))
            case "resume_node":
                return d.resume_node(target)
            case "requeue_job":
                exclude = [n for n in action.params.get("exclude", "").split(",") if n]
                return d.requeue_job(target, exclude)
            case "hold_job":
                return d.hold_job(target)
            case "release_job":
                return d.release_job(target)
            case "cancel_job":
                return d.cancel_job(target)
        raise CommandFailed(f"unknown action {action.action!r}", ())

    # ------------------------------------------------------------ audit

    def _finish(
        self,
        anomaly: Anomaly,
        action: Action,
        status: str,
        reason: str,
        attempts: tuple[Attempt, ...],
        mode: Mode | None = None,
        noop: bool = False,
        user: str | None = None,
    ) -> Action:
        now = self.clock()
        done = msgspec.structs.replace(
            action,
            status=status,  # type: ignore[arg-type]
            mode=mode or action.mode,
            reason=reason,
            applied_at=now if status == "applied" else None,
        )
        entry = self._entry(status, anomaly, done, done.mode, reason)
        entry["attempts"] = [a.as_dict() for a in attempts]
        entry["noop"] = noop
        entry["user"] = user
        self._audit(entry)
        self._outcomes[action.action_id] = status
        return done

    def _entry(self, event: str, anomaly: Anomaly, action: Action, mode: str, reason: str) -> dict[str, Any]:
        return {
            "event": event,
            "recorded_at": self.clock(),
            "action_id": action.action_id,
            "action": action.action,
            "target": action.target,
            "params": action.params,
            "mode": mode,
            "reason": reason,
            "anomaly_id": anomaly.anomaly_id,
            "kind": anomaly.kind,
            "category": anomaly.category,
            "layer": anomaly.layer,
            "transient": anomaly.transient,
            "confidence": anomaly.confidence,
            "job_id": anomaly.job_id,
            "nodes": anomaly.nodes,
            "gpus": anomaly.gpus,
            "evidence": anomaly.evidence[:5],
            "severity": anomaly.severity,
            "onset_ts": anomaly.onset_ts,
            "detected_at": anomaly.detected_at,
            "decided_at": action.decided_at,
            "applied_at": action.applied_at,
            "driver": self.driver.name if self.driver is not None else None,
        }

    def _audit(self, entry: dict[str, Any]) -> None:
        if self.audit is not None:
            self.audit.append(entry)
