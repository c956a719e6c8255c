"""The flow's notification output: anomalies and actions handed to a :class:`Notifier` on its own thread.

The dataflow only puts items on a queue; a background thread delivers them (Alertmanager,
apprise), so a slow or unreachable receiver never delays detection. Each delivery that fails
for good, and each message dropped over the rate limit, is written to the audit log. At the
end of a replay (the sink closes), what is queued is delivered before the run ends.
"""

from __future__ import annotations

import queue
import threading
import time
from pathlib import Path
from typing import Any

import msgspec
from bytewax.outputs import DynamicSink, StatelessSinkPartition

from trainguard.actions.audit import AuditLog
from trainguard.actions.notify import Delivery, Notifier, NotifySettings
from trainguard.actions.records import Action
from trainguard.actions.silences import Silences
from trainguard.dataflows import metrics
from trainguard.detectors.events import Anomaly

__all__ = ["NotifySink"]


class _Deliverer:
    """The background thread of one worker."""

    def __init__(self, notifier: Notifier, audit: AuditLog | None) -> None:
        self.notifier = notifier
        self.audit = audit
        self.inbox: queue.Queue[list[Any] | None] = queue.Queue()
        self.thread = threading.Thread(target=self._work, name="trainguard-notify", daemon=True)
        self.thread.start()

    def _work(self) -> None:
        while (items := self.inbox.get()) is not None:
            for item in items:
                if isinstance(item, Anomaly):
                    done = self.notifier.anomaly(item)
                elif isinstance(item, Action):
                    done = self.notifier.action(item)
                else:
                    continue
                self._record(done)

    def _record(self, deliveries: list[Delivery]) -> None:
        for d in deliveries:
            metrics.NOTIFICATIONS.labels(d.channel, "delivered" if d.ok else "failed").inc()
            if not d.ok and self.audit is not None:
                entry = {"event": "notification_failed", "recorded_at": time.time(), **msgspec.structs.asdict(d)}
                self.audit.append(entry)

    def close(self) -> None:
        self.inbox.put(None)
        self.thread.join()


class _NotifyPartition(StatelessSinkPartition[Any]):
    def __init__(self, deliverer: _Deliverer) -> None:
        self.deliverer = deliverer

    def write_batch(self, items: list[Any]) -> None:
        self.deliverer.inbox.put(list(items))

    def close(self) -> None:
        self.deliverer.close()


class NotifySink(DynamicSink[Any]):
    """Delivers the anomalies and actions it is given (see :mod:`trainguard.actions.notify`)."""

    def __init__(self, settings: NotifySettings, audit_log: str | None = None, silences: Path | None = None) -> None:
        self.settings = settings
        self.audit_log = audit_log
        self.silences = silences

    def build(self, step_id: str, worker_index: int, worker_count: int) -> _NotifyPartition:
        audit = AuditLog(self.audit_log) if self.audit_log else None
        silences = Silences(self.silences) if self.silences is not None else None
        return _NotifyPartition(_Deliverer(Notifier(self.settings, silences=silences), audit))
