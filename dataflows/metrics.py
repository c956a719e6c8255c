"""Prometheus metrics of a running flow, and the HTTP endpoint that serves them with a health check.

Counters are bumped once per batch (not per event), so they cost nothing on the hot path.
``GET /metrics`` is the Prometheus exposition; ``GET /healthz`` answers ``ok`` while the
flow is alive and has made progress within ``stale_after_s``.
"""

from __future__ import annotations

import hmac
import threading
import time
from collections import Counter as Tally
from collections.abc import Iterable
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client import REGISTRY, Counter, Gauge, Histogram, make_wsgi_app
from prometheus_client.core import CounterMetricFamily

from trainguard.detectors.lenient import FIELD_WARNINGS
from trainguard.detectors.lifecycle import is_false_alarm

EVENTS = Counter("trainguard_events_total", "Input records decoded, by stream.", ["topic"])
DEAD_LETTERS = Counter("trainguard_dead_letters_total", "Input records refused, by stream.", ["topic"])
ANOMALIES = Counter("trainguard_anomalies_total", "Anomalies opened, by kind.", ["kind"])
RESOLVED = Counter("trainguard_anomalies_resolved_total", "Anomalies resolved, by kind.", ["kind"])
FALSE_ALARMS = Counter(
    "trainguard_false_alarms_total",
    "Hang alarms the job's own progress resolved (it was never hung): precision, measured without labels.",
    ["kind"],
)
UNCLASSIFIED = Counter(
    "trainguard_unclassified_total",
    "Jobs that stopped after fatal-looking lines no signature explains: the catalogue's to-do list.",
)


class _FieldWarnings:
    """Exports :data:`detectors.lenient.FIELD_WARNINGS` (counted by the decoder, which knows no Prometheus)."""

    def collect(self) -> Iterable[CounterMetricFamily]:
        family = CounterMetricFamily(
            "trainguard_field_warnings",
            "Optional fields of input records coerced or nulled because their value did not fit, by stream and field.",
            labels=["topic", "field"],
        )
        for (topic, field), n in sorted(FIELD_WARNINGS.items()):
            family.add_metric([topic, field], n)
        yield family


REGISTRY.register(_FieldWarnings())
ACTIONS = Counter("trainguard_actions_total", "Actions decided, by action and status.", ["action", "status"])
NOTIFICATIONS = Counter(
    "trainguard_notifications_total",
    "Notifications, by channel and outcome (delivered, failed).",
    ["channel", "outcome"],
)
WATERMARK_DELAY = Gauge("trainguard_watermark_delay_seconds", "Wall clock minus the event-time watermark (live).")
CONSUMER_LAG = Gauge(
    "trainguard_consumer_lag_messages",
    "Messages on the broker not yet read, per input partition.",
    ["topic", "partition"],
)
BREAKER_OPEN = Gauge("trainguard_breaker_open", "1 while the drain circuit breaker is open (drains only recommended).")
BUFFERED = Gauge("trainguard_reorder_buffer_events", "Events waiting in the router's reorder buffer.")
STEP_SECONDS = Histogram(
    "trainguard_step_seconds",
    "Time to process one batch, by step.",
    ["step"],
    buckets=(0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0),
)
# Looked up once: every key's batch observes one (a labels() look-up takes a lock and a dict per call).
ROUTE_SECONDS, DETECT_SECONDS = STEP_SECONDS.labels("route"), STEP_SECONDS.labels("detect")
LAST_PROGRESS = Gauge("trainguard_last_progress_timestamp_seconds", "Wall time the flow last processed a batch.")


_last_progress = time.time()


def count_anomalies(items: Iterable[Any]) -> None:
    """Count a batch of anomaly records: openings by kind, resolutions, false alarms, unclassified crashes."""
    opened: Tally[tuple[str, ...]] = Tally()
    resolved: Tally[tuple[str, ...]] = Tally()
    false_alarms: Tally[tuple[str, ...]] = Tally()
    for a in items:
        if a.resolved_at is None:
            if a.revised_at is not None:
                continue  # an open anomaly published again, better localised: not a new one
            opened[(a.kind,)] += 1
            if a.category == "unclassified":
                UNCLASSIFIED.inc()
            continue
        resolved[(a.kind,)] += 1
        if is_false_alarm(a.kind, a.resolution):
            false_alarms[(a.kind,)] += 1
    for counter, tally in ((ANOMALIES, opened), (RESOLVED, resolved), (FALSE_ALARMS, false_alarms)):
        for labels, n in tally.items():
            counter.labels(*labels).inc(n)


def mark_progress() -> None:
    """The flow just processed a batch."""
    global _last_progress
    _last_progress = time.time()
    LAST_PROGRESS.set(_last_progress)


def bucket_quantile(buckets: dict[float, float], q: float) -> float | None:
    """The smallest histogram bound ``le`` whose cumulative count reaches ``q`` of the total.

    >>> bucket_quantile({0.001: 90.0, 0.005: 99.0, float("inf"): 100.0}, 0.99)
    0.005
    """
    total = buckets.get(float("inf"), 0.0)
    if not total:
        return None
    return min(le for le, count in buckets.items() if count >= q * total)


def count_by(metric: Counter, labels: Iterable[tuple[str, ...]]) -> None:
    """Increment ``metric`` once per distinct label tuple, by how often it occurs."""
    for label, n in Tally(labels).items():
        metric.labels(*label).inc(n)


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass  # scrapes every few seconds would flood the console


class MetricsServer:
    """Serves /metrics and /healthz on ``host:port`` from a daemon thread."""

    def __init__(
        self, port: int, host: str = "127.0.0.1", stale_after_s: float = 60.0, token: str | None = None
    ) -> None:
        self.stale_after_s = stale_after_s
        self.started = time.time()
        metrics_app = make_wsgi_app(REGISTRY)
        expected = f"Bearer {token}".encode() if token else None

        def app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
            # /healthz stays open for liveness probes; /metrics wants the token when one is set.
            if expected is not None and environ.get("PATH_INFO") != "/healthz":
                given = environ.get("HTTP_AUTHORIZATION", "").encode()
                if not hmac.compare_digest(given, expected):
                    start_response("401 Unauthorized", [("WWW-Authenticate", "Bearer"), ("Content-Type", "text/plain")])
                    return [b"unauthorized\n"]
            if environ.get("PATH_INFO") == "/healthz":
                healthy = time.time() - max(_last_progress, self.started) <= self.stale_after_s
                status = "200 OK" if healthy else "503 Service Unavailable"
                start_response(status, [("Content-Type", "text/plain"), ("X-Content-Type-Options", "nosniff")])
                return [b"ok\n" if healthy else b"stalled\n"]
            return metrics_app(environ, start_response)

        self._server = make_server(host, port, app, handler_class=_Quiet)
        self.port = self._server.server_port
        self._thread = threading.Thread(target=self._server.serve_forever, name="metrics", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
