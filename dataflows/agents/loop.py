"""One loop for every polling agent: interval, back-off, publishing, counters, a clean stop.

An agent is anything with ``poll()`` returning ``(stream, record)`` pairs of the wire
contract (:class:`Agent` gives the optional hooks their defaults). :func:`run_agent`
calls it every ``interval`` seconds, publishes what it returns, and — only once the
brokers confirm delivery — lets it ``commit()`` (the log shipper's at-least-once). A
poll that cannot read its source raises :class:`SourceUnavailable`: on the first poll
that is a configuration mistake and ends the run with the agent's sentence; later it
is an outage, one warning line per failure, and the loop backs off (doubling up to
``max_backoff_s``) and goes on. SIGTERM (a service manager) and Ctrl-C stop it between
polls.

>>> class Counter(Agent):
...     name = "counter"
...     def __init__(self): self.n = 0
...     def poll(self):
...         self.n += 1
...         return [("logs", {"ts": float(self.n), "node": "n1", "line": f"tick {self.n}"})]
>>> class Collect:
...     def __init__(self): self.records = []
...     def publish(self, stream, record, key=None): self.records.append((stream, record["line"], key))
...     def flush(self, timeout_s=10.0): return 0
>>> out = Collect()
>>> run_agent(Counter(), out, interval_s=0.0, count=2).published
2
>>> out.records
[('logs', 'tick 1', 'n1'), ('logs', 'tick 2', 'n1')]
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from prometheus_client import Counter

from trainguard.dataflows.metrics import mark_progress

Publish = tuple[str, dict[str, Any]]  # (stream, wire-contract record)

POLLS = Counter("trainguard_agent_polls", "Polls an agent made", ["agent"])
RECORDS = Counter("trainguard_agent_records", "Records an agent published", ["agent", "stream"])
FAILURES = Counter("trainguard_agent_failures", "Polls (or targets of a poll) that could not be read", ["agent"])


class SourceUnavailable(Exception):
    """A poll could not read its source; the message is one sentence that says what to check."""


class Sink(Protocol):
    """Where records go (:class:`~trainguard.agents.publisher.RecordPublisher`)."""

    def publish(self, topic: str, record: dict[str, Any], key: str | None = None) -> None: ...

    def flush(self, timeout_s: float = 10.0) -> int: ...


class Agent:
    """The polling protocol with its optional hooks' defaults; an agent overrides ``poll``."""

    name = "agent"

    def poll(self) -> list[Publish]:
        """The records due now."""
        raise NotImplementedError

    def wait(self, seconds: float, stop: threading.Event) -> list[Publish]:
        """Between polls: sleep (an agent that waits on events returns what it saw)."""
        stop.wait(seconds)
        return []

    def problems(self) -> list[str]:
        """Sentences about parts of the last poll that failed while the rest went on (e.g. one
        scrape target of many); each is a warning line and a failure count. Cleared when read."""
        return []

    def commit(self) -> None:
        """What the last poll returned is delivered (the brokers confirmed it)."""

    def close(self) -> None:
        """Release what the agent holds."""

    def key(self, stream: str, record: dict[str, Any]) -> str | None:
        """The Kafka key of a record: its job, else its node (so one job's records stay in order)."""
        return record.get("job_id") or record.get("node")


@dataclass
class AgentRun:
    """What a run of an agent did."""

    polls: int = 0
    published: int = 0
    failures: int = 0
    warnings: list[str] = field(default_factory=list)


class DeliveryFailed(Exception):
    """The brokers did not confirm delivery in time; nothing was committed."""


def run_agent(
    agent: Agent,
    sink: Sink,
    *,
    interval_s: float,
    count: int | None = None,
    stop: threading.Event | None = None,
    warn: Callable[[str], None] | None = None,
    max_backoff_s: float = 60.0,
    confirm_s: float = 30.0,
) -> AgentRun:
    """Poll ``agent`` every ``interval_s`` until ``count`` polls, ``stop``, SIGTERM or Ctrl-C.

    Raises :class:`SourceUnavailable` when the first poll fails, :class:`DeliveryFailed`
    when the brokers do not confirm a poll's records within ``confirm_s``.
    """
    stop = stop or threading.Event()
    run = AgentRun()
    backoff = interval_s
    restore = _stop_on_sigterm(stop)
    try:
        while not stop.is_set() and (count is None or run.polls < count):
            started = time.monotonic()
            try:
                records = agent.poll()
            except SourceUnavailable as exc:
                if run.polls == 0 and run.failures == 0:
                    raise
                run.failures += 1
                FAILURES.labels(agent.name).inc()
                _warn(run, warn, f"{agent.name}: {exc} (retrying in {backoff:g}s)")
                stop.wait(backoff)
                backoff = min(max(backoff * 2, 1.0), max_backoff_s)
                continue
            backoff = interval_s
            run.polls += 1
            POLLS.labels(agent.name).inc()
            mark_progress()  # /healthz: this agent is alive
            for problem in agent.problems():
                run.failures += 1
                FAILURES.labels(agent.name).inc()
                _warn(run, warn, f"{agent.name}: {problem}")
            _deliver(agent, sink, records, run, confirm_s)
            if count is None or run.polls < count:
                seen = agent.wait(max(0.0, interval_s - (time.monotonic() - started)), stop)
                _deliver(agent, sink, seen, run, confirm_s)
    except KeyboardInterrupt:
        pass
    finally:
        restore()
    return run


def _deliver(agent: Agent, sink: Sink, records: list[Publish], run: AgentRun, confirm_s: float) -> None:
    for stream, record in records:
        sink.publish(stream, record, key=agent.key(stream, record))
        RECORDS.labels(agent.name, stream).inc()
    if sink.flush(confirm_s) > 0:
        raise DeliveryFailed(f"the brokers did not confirm delivery within {confirm_s:g}s; nothing was committed.")
    if records:
        agent.commit()  # only now: at least once
        run.published += len(records)


def _warn(run: AgentRun, warn: Callable[[str], None] | None, message: str) -> None:
    run.warnings.append(message)
    if warn is not None:
        warn(message)


def _stop_on_sigterm(stop: threading.Event) -> Callable[[], None]:
    """SIGTERM sets ``stop`` (in the main thread only: signals cannot be handled elsewhere)."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    previous = signal.signal(signal.SIGTERM, lambda *_: stop.set())
    return lambda: signal.signal(signal.SIGTERM, previous)
