"""The policy and action steps of the flow, and building the executor from the settings.

Scheduler commands take tens of milliseconds to seconds (and minutes when the
controller is down), so with a real driver the executor works on its own thread:
detection never waits for an action. Outcomes come back on the next activation.
"""

from __future__ import annotations

import logging
import pickle
import queue
import threading
import time
from datetime import UTC, datetime, timedelta

import msgspec
from bytewax.operators import StatefulBatchLogic

from trainguard.actions.audit import AuditLog
from trainguard.actions.drivers import make_driver
from trainguard.actions.executor import ActionExecutor
from trainguard.actions.policy import Policy
from trainguard.actions.records import Action
from trainguard.actions.silences import Silences
from trainguard.dataflows import metrics
from trainguard.dataflows.config import Settings
from trainguard.detectors.events import Anomaly
from trainguard.detectors.lifecycle import is_false_alarm

log = logging.getLogger(__name__)

Decision = tuple[Anomaly, Action | None]  # no action: withdraw this anomaly's pending ones (a false alarm)


class PolicyLogic(StatefulBatchLogic[Anomaly, Decision, bytes]):
    """Bytewax shell around the cluster-wide :class:`Policy` (budgets and cooldowns are state)."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy

    def on_batch(self, values: list[Anomaly]) -> tuple[list[Decision], bool]:
        out: list[Decision] = []
        for a in values:
            if a.resolved_at is not None:
                # The job went on by itself: what was decided for the alarm must not happen now.
                if is_false_alarm(a.kind, a.resolution):
                    out.append((a, None))
                continue
            out += [(a, x) for x in self.policy.decide(a)]
        return out, StatefulBatchLogic.RETAIN

    def snapshot(self) -> bytes:
        return pickle.dumps(self.policy, protocol=pickle.HIGHEST_PROTOCOL)


def make_executor(settings: Settings) -> ActionExecutor:
    audit = AuditLog(settings.audit_log) if settings.audit_log else None
    path = settings.silences_path
    silences = Silences(path, audit) if path is not None else None
    return ActionExecutor(settings.policy, make_driver(settings.scheduler), audit, silences=silences)


class BackgroundExecutor:
    """Runs an :class:`ActionExecutor` on a thread of its own; results are collected later."""

    def __init__(self, executor: ActionExecutor) -> None:
        self.executor = executor
        self._inbox: queue.Queue[list[Decision] | None] = queue.Queue()
        self._results: list[Action] = []
        self._lock = threading.Lock()
        self._pending = 0
        self._unfinished: dict[str, Decision] = {}  # submitted, not yet carried out (what a snapshot keeps)
        self._withdrawn: dict[str, str] = {}  # anomaly id -> why its queued actions must not run
        self._thread = threading.Thread(target=self._work, name="trainguard-actions", daemon=True)
        self._thread.start()
        self._submit_call(executor.reconcile)

    def _submit_call(self, fn: object) -> None:
        with self._lock:
            self._pending += 1
        self._inbox.put(fn)  # type: ignore[arg-type]

    def submit(self, decisions: list[Decision]) -> None:
        if decisions:
            with self._lock:
                self._pending += 1
                self._unfinished.update((action.action_id, (a, action)) for a, action in decisions)
            self._inbox.put(decisions)

    def withdraw(self, anomaly_id: str, why: str) -> None:
        """Actions of this anomaly still queued are not carried out (reported suppressed instead)."""
        with self._lock:
            self._withdrawn[anomaly_id] = why

    def unfinished(self) -> list[Decision]:
        with self._lock:
            return list(self._unfinished.values())

    @property
    def pending(self) -> int:
        with self._lock:
            return self._pending + len(self._results)

    def collect(self) -> list[Action]:
        with self._lock:
            out, self._results = self._results, []
        return out

    def wait(self, timeout_s: float = 600.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self._lock:
                if self._pending == 0:
                    return
            time.sleep(0.02)

    def _work(self) -> None:
        while True:
            job = self._inbox.get()
            try:
                done = job() if callable(job) else [x for a, action in job if (x := self._one(a, action))]
            except Exception:
                log.exception("the action executor failed")
                done = []
            with self._lock:
                self._results.extend(done)
                self._pending -= 1

    def _one(self, anomaly: Anomaly, action: Action) -> Action | None:
        with self._lock:
            withdrawn = self._withdrawn.get(anomaly.anomaly_id)
        if withdrawn is not None and action.status == "recommended":
            with self._lock:
                self._unfinished.pop(action.action_id, None)
            return msgspec.structs.replace(action, status="suppressed", reason=f"{action.reason}; {withdrawn}")
        try:
            done = self.executor.execute(anomaly, action)
            with self._lock:
                self._unfinished.pop(action.action_id, None)
            return done
        except Exception as exc:
            log.exception("executing %s on %s failed", action.action, action.target)
            return msgspec.structs.replace(action, status="failed", reason=f"{action.reason}; internal error: {exc}")


class ActionLogic(StatefulBatchLogic[Decision, Action, bytes]):
    """Bytewax shell around the executor.

    Its durable state is the audit log; a snapshot keeps only the decisions still
    queued for the executor's thread, so a crash right after an epoch loses none of them
    (the audit log makes resubmitting one that did run a no-op).
    """

    def __init__(self, executor: ActionExecutor, resumed: list[Decision] | None = None) -> None:
        self.executor = executor
        self.background = BackgroundExecutor(executor) if executor.driver is not None else None
        self._resumed: list[Action] = []
        self._recommended: dict[str, list[Action]] = {}  # anomaly id -> recommendations awaiting an operator
        if resumed:
            if self.background is not None:
                self.background.submit(resumed)
            else:
                self._resumed = [x for a, action in resumed if (x := executor.execute(a, action))]

    def on_batch(self, values: list[Decision]) -> tuple[list[Action], bool]:
        withdrawn = self._withdraw([a for a, action in values if action is None])
        values = [(a, action) for a, action in values if action is not None]
        if self.background is None:
            done = withdrawn + [x for a, action in values if (x := self.executor.execute(a, action))]
            if self._resumed:
                done, self._resumed = self._resumed + done, []
            return self._remember(done), StatefulBatchLogic.RETAIN
        self.background.submit(values)
        return withdrawn + self._collect(), StatefulBatchLogic.RETAIN

    def _withdraw(self, resolved: list[Anomaly]) -> list[Action]:
        """False alarms resolved: queued actions are dropped; recommendations still awaiting an operator
        are published again as suppressed, so nobody approves a requeue of a job that went on."""
        out: list[Action] = []
        for anomaly in resolved:
            why = f"anomaly resolved: {anomaly.resolution}"
            if self.background is not None:
                self.background.withdraw(anomaly.anomaly_id, why)
            for action in self._recommended.pop(anomaly.anomaly_id, []):
                out.append(msgspec.structs.replace(action, status="suppressed", reason=f"{action.reason}; {why}"))
        return out

    def _remember(self, done: list[Action]) -> list[Action]:
        for action in done:
            if action.status == "recommended" and action.action != "notify":
                self._recommended.setdefault(action.anomaly_id, []).append(action)
        while len(self._recommended) > 1000:  # recent anomalies only
            self._recommended.pop(next(iter(self._recommended)))
        return done

    def on_notify(self) -> tuple[list[Action], bool]:
        return self._collect(), StatefulBatchLogic.RETAIN

    def on_eof(self) -> tuple[list[Action], bool]:
        if self.background is not None:
            self.background.wait()
        return self._collect(), StatefulBatchLogic.RETAIN

    def notify_at(self) -> datetime | None:
        if self.background is not None and self.background.pending:
            return datetime.now(UTC) + timedelta(seconds=0.05)
        return None

    def _collect(self) -> list[Action]:
        metrics.BREAKER_OPEN.set(1 if self.executor.breaker.is_open else 0)
        return self._remember(self.background.collect()) if self.background is not None else []

    def snapshot(self) -> bytes:
        queued = self.background.unfinished() if self.background is not None else []
        return pickle.dumps(queued, protocol=pickle.HIGHEST_PROTOCOL) if queued else b""
