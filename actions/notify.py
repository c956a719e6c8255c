"""Notifications: anomalies and actions delivered to people, through Alertmanager and apprise.

One **alert per anomaly** goes to Prometheus Alertmanager's v2 API, its labels naming the
anomaly (``anomaly_id``, kind, category, layer, severity, job, node) and its annotations
saying what happened (``summary``, ``description``, ``runbook_url``, the actions decided). The
same alert is posted again when an action is decided or carried out (Alertmanager keeps one
alert per label set, so annotations are updated, never duplicated) and with ``endsAt`` when
the anomaly resolves. Through **apprise** (Slack, Teams, PagerDuty, e-mail, webhooks …) a
message goes out when an anomaly opens, when it resolves, and for each action decided.

Delivery never blocks detection: :class:`Notifier` is called from a background thread
(see ``trainguard.dataflows.notify_step``). Each delivery is retried with backoff; a message
over the rate limit is dropped and counted; a delivery that fails for good is returned to the
caller, who audits it.

>>> from trainguard.detectors.events import Anomaly
>>> a = Anomaly(anomaly_id="an-1", detected_at=1733000000.0, kind="crash", category="xid_79",
...             layer="hardware", job_id="42", nodes=["gpu-node-07"], evidence=["Xid 79"])
>>> alert = alertmanager_alert(a, [], NotifySettings(runbook_url="https://runbooks.example/{kind}"))
>>> alert["labels"]["alertname"], alert["labels"]["node"], alert["annotations"]["runbook_url"]
('TrainguardAnomaly', 'gpu-node-07', 'https://runbooks.example/crash')
>>> summary(a)
'crash/xid_79 (hardware) on gpu-node-07, job 42'
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections import deque
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, Literal

import msgspec

from trainguard.actions.records import Action
from trainguard.actions.silences import Silences
from trainguard.detectors.describe import summary
from trainguard.detectors.events import Anomaly

__all__ = ["Delivery", "Notifier", "NotifySettings", "alertmanager_alert", "summary"]

_SEVERITY_ORDER = {"info": 0, "warning": 1, "critical": 2}


class NotifySettings(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """The ``notify:`` section of the config file (nothing is sent when both lists are empty)."""

    alertmanager: list[str] = []  # base URLs, e.g. http://alertmanager:9093
    apprise: list[str] = []  # apprise URLs: slack://…, msteams://…, pagerduty://…, mailto://…, json://host/path
    min_severity: Literal["info", "warning", "critical"] = "warning"
    # {kind} and {category} are filled in; the default points at this project's runbooks.
    runbook_url: str = "https://github.com/trainguard/trainguard/blob/main/docs/runbooks.md#{kind}"
    timeout_s: float = 5.0
    attempts: int = 3
    backoff_s: float = 1.0
    max_per_minute: int = 60  # apprise messages; Alertmanager dedups alerts itself

    @property
    def enabled(self) -> bool:
        return bool(self.alertmanager or self.apprise)


class Delivery(msgspec.Struct, frozen=True):
    """One delivery attempt's outcome (what the audit log records)."""

    channel: str  # "alertmanager" or "apprise"
    anomaly_id: str
    ok: bool
    detail: str = ""


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat().replace("+00:00", "Z")


def alertmanager_alert(anomaly: Anomaly, actions: list[Action], settings: NotifySettings) -> dict[str, Any]:
    """The Alertmanager v2 alert for ``anomaly`` and the actions decided for it so far."""
    labels = {
        "alertname": "TrainguardAnomaly",
        "anomaly_id": anomaly.anomaly_id,
        "kind": anomaly.kind,
        "category": anomaly.category,
        "layer": anomaly.layer,
        "severity": anomaly.severity,
    }
    if anomaly.job_id:
        labels["job_id"] = anomaly.job_id
    if anomaly.nodes:
        labels["node"] = anomaly.nodes[0]
    decided = "; ".join(f"{a.action} {a.target} ({a.status}, {a.mode})" for a in actions) or "none yet"
    description = "\n".join(
        [
            f"detected at {_iso(anomaly.detected_at)}",
            *(f"evidence: {line}" for line in anomaly.evidence[:5]),
            *([f"remedy: {anomaly.remedy}"] if anomaly.remedy else []),
            f"actions: {decided}",
            *([f"resolved: {anomaly.resolution}"] if anomaly.resolved else []),
        ]
    )
    alert: dict[str, Any] = {
        "labels": labels,
        "annotations": {
            "summary": anomaly.summary or summary(anomaly),
            "description": description,
            "runbook_url": anomaly.runbook_url
            or settings.runbook_url.format(kind=anomaly.kind, category=anomaly.category),
            "actions": decided,
        },
        "startsAt": _iso(anomaly.detected_at),
    }
    if anomaly.resolved_at is not None:
        alert["endsAt"] = _iso(anomaly.resolved_at)
    return alert


class Notifier:
    """Delivers anomalies and actions; call :meth:`anomaly` and :meth:`action` from one thread."""

    def __init__(
        self,
        settings: NotifySettings,
        *,
        post: Callable[[str, bytes, float], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        silences: Silences | None = None,
    ) -> None:
        self.settings = settings
        self.silences = silences
        self._post = post or _post_json
        self._clock = clock
        self._sleep = sleep
        self._anomalies: dict[str, Anomaly] = {}
        self._actions: dict[str, dict[str, Action]] = {}
        self._sent: set[tuple[str, str]] = set()  # (anomaly id, what) already messaged through apprise
        self._recent: deque[float] = deque()
        self.dropped = 0  # apprise messages over the rate limit
        self._apprise: Any = None
        if settings.apprise:
            import apprise

            self._apprise = apprise.Apprise()
            for url in settings.apprise:
                if not self._apprise.add(url):
                    raise ValueError(f"notify.apprise has a URL apprise does not understand: {url!r}")

    def wants(self, anomaly: Anomaly) -> bool:
        """Severe enough, and not silenced (a silenced anomaly is archived, never sent)."""
        if _SEVERITY_ORDER[anomaly.severity] < _SEVERITY_ORDER[self.settings.min_severity]:
            return False
        return self.silences is None or self.silences.matching(anomaly) is None

    def anomaly(self, anomaly: Anomaly) -> list[Delivery]:
        """An anomaly opened or resolved."""
        if not self.wants(anomaly):
            return []
        self._anomalies[anomaly.anomaly_id] = anomaly
        what = "resolved" if anomaly.resolved else "opened"
        title = f"[{'resolved' if anomaly.resolved else anomaly.severity}] {summary(anomaly)}"
        body = anomaly.resolution if anomaly.resolved else "\n".join(anomaly.evidence[:5])
        done = self._to_alertmanager(anomaly) + self._to_apprise(anomaly.anomaly_id, what, title, body or "")
        for early in self._actions.get(anomaly.anomaly_id, {}).values():
            done += self._to_apprise(
                anomaly.anomaly_id, f"action {early.action_id} {early.status}", *_action_text(early)
            )
        return done

    def action(self, action: Action) -> list[Delivery]:
        """An action decided (recommended) or carried out (applied, failed) for a notified anomaly."""
        if action.status == "suppressed":
            return []
        self._actions.setdefault(action.anomaly_id, {})[action.action_id] = action
        anomaly = self._anomalies.get(action.anomaly_id)
        if anomaly is None:  # its anomaly has not arrived yet (or is not notified): sent with it
            return []
        what = f"action {action.action_id} {action.status}"
        return self._to_alertmanager(anomaly) + self._to_apprise(anomaly.anomaly_id, what, *_action_text(action))

    def _to_alertmanager(self, anomaly: Anomaly) -> list[Delivery]:
        if not self.settings.alertmanager:
            return []
        actions = list(self._actions.get(anomaly.anomaly_id, {}).values())
        payload = json.dumps([alertmanager_alert(anomaly, actions, self.settings)]).encode()
        out = []
        for base in self.settings.alertmanager:
            url = base.rstrip("/") + "/api/v2/alerts"
            send = lambda url=url: self._post(url, payload, self.settings.timeout_s)  # noqa: E731
            out.append(self._deliver("alertmanager", anomaly.anomaly_id, send))
        return out

    def _to_apprise(self, anomaly_id: str, what: str, title: str, body: str) -> list[Delivery]:
        if self._apprise is None or (anomaly_id, what) in self._sent:
            return []
        now = self._clock()
        while self._recent and now - self._recent[0] > 60.0:
            self._recent.popleft()
        if len(self._recent) >= self.settings.max_per_minute:
            self.dropped += 1
            return [Delivery("apprise", anomaly_id, False, "dropped: over notify.max_per_minute")]
        self._recent.append(now)
        self._sent.add((anomaly_id, what))

        def send() -> None:
            if not self._apprise.notify(title=title, body=body or title):
                raise OSError("apprise reported a failed delivery")

        return [self._deliver("apprise", anomaly_id, send)]

    def _deliver(self, channel: str, anomaly_id: str, send: Callable[[], None]) -> Delivery:
        error = ""
        for attempt in range(max(1, self.settings.attempts)):
            try:
                send()
                return Delivery(channel, anomaly_id, True)
            except (OSError, urllib.error.URLError) as exc:
                error = str(exc)
                if attempt + 1 < self.settings.attempts:
                    self._sleep(self.settings.backoff_s * 2**attempt)
        return Delivery(channel, anomaly_id, False, error)


def _action_text(action: Action) -> tuple[str, str]:
    return f"[{action.status}] {action.action} {action.target} ({action.mode} mode)", action.reason


def _post_json(url: str, payload: bytes, timeout_s: float) -> None:
    request = urllib.request.Request(url, data=payload, headers={"Content-Type": "application/json"}, method="POST")
    with urllib.request.urlopen(request, timeout=timeout_s) as response:
        if response.status >= 300:
            raise OSError(f"HTTP {response.status}")
