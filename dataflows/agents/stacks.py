"""``trainguard collect-stacks``: the Python stacks of a job's ranks on this node, as ``stacks`` records.

Each rank process of the job (:mod:`trainguard.agents.jobprocs`) is dumped with
``py-spy dump --json --pid PID`` — an argument list, never a shell — a few at a time.
A stopped or uninterruptible process cannot be suspended by py-spy, and need not be: it is
read without (``--nonblocking``). A process py-spy cannot read becomes a record with its
``error``; a rank the node should run that no process has becomes a ``gone`` record.

:func:`dump_job` is one round (``--once``, and what a test calls); :class:`StackAgent`
answers ``diagnose`` actions — the flow publishes them, applied, on the actions topic —
once per action id and at most once per ``min_interval_s`` per job; :func:`serve` is the
Kafka loop around it.
"""

from __future__ import annotations

import logging
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import msgspec

from trainguard.agents.jobprocs import JobProcess, job_processes, process_state

__all__ = ["PySpyMissing", "StackAgent", "dump_job", "dump_process", "find_py_spy", "serve"]

log = logging.getLogger(__name__)

DUMP_TIMEOUT_S = 20.0  # py-spy reads a big process in well under a second; a wedged one must not stall the round
PARALLEL_DUMPS = 4
MAX_THREADS = 16  # per process: the main thread and the busiest others
MAX_FRAMES = 64  # per thread, innermost kept
MAX_RECORD_BYTES = 200 * 1024  # under the decoder's 256 KiB limit
MAX_REQUEST_AGE_S = 900.0  # a diagnose older than this (a consumer catching up) is not answered: the moment passed
_NONBLOCKING_STATES = ("stopped", "disk")  # py-spy cannot suspend these; they do not move anyway


class PySpyMissing(RuntimeError):
    """py-spy cannot be found; the message is one sentence."""


def find_py_spy(explicit: str | Path | None = None) -> str:
    """The py-spy to run: ``explicit``, else the one next to this Python (a virtualenv's), else on PATH."""
    if explicit is not None:
        path = Path(explicit)
        if path.is_file() and path.stat().st_mode & 0o111:
            return str(path)
        raise PySpyMissing(f"--py-spy {explicit} is not an executable file; give the path of py-spy.")
    beside = Path(sys.executable).parent / "py-spy"
    if beside.is_file():
        return str(beside)
    found = shutil.which("py-spy")
    if found is None:
        raise PySpyMissing(
            "py-spy is not installed next to this Python or on PATH; "
            "install it (pip install py-spy) or pass --py-spy PATH."
        )
    return found


def _thread(raw: dict[str, Any]) -> dict[str, Any]:
    frames = [
        {"name": str(f.get("name") or "?"), "filename": str(f.get("filename") or ""), "line": f.get("line")}
        for f in (raw.get("frames") or [])[:MAX_FRAMES]
    ]
    return {
        "name": raw.get("thread_name"),
        "tid": raw.get("os_thread_id"),
        "active": raw.get("active"),
        "owns_gil": raw.get("owns_gil"),
        "frames": frames,
    }


def _threads(dump: list[dict[str, Any]], pid: int) -> list[dict[str, Any]]:
    """py-spy's threads as the record's, the main thread first, bounded in number and size."""
    threads = [_thread(t) for t in dump if isinstance(t, dict)]
    threads.sort(key=lambda t: (t["tid"] != pid and t["name"] != "MainThread", not t["active"]))
    threads = threads[:MAX_THREADS]
    while len(threads) > 1 and len(msgspec.json.encode(threads)) > MAX_RECORD_BYTES:
        threads.pop()  # a process with hundreds of deep stacks: the main thread is what matters
    return threads


def dump_process(py_spy: str, pid: int, state: str, timeout_s: float = DUMP_TIMEOUT_S) -> tuple[list[dict], str | None]:
    """``(threads, error)`` of one process; the error is py-spy's own first line, or why it did not answer."""
    attempts = [["--nonblocking"]] if state in _NONBLOCKING_STATES else [[], ["--nonblocking"]]
    error = None
    for extra in attempts:
        argv = [py_spy, "dump", "--json", *extra, "--pid", str(pid)]
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=False)
        except subprocess.TimeoutExpired:
            error = f"py-spy did not answer within {timeout_s:g} s"
            continue
        if done.returncode == 0:
            try:
                return _threads(msgspec.json.decode(done.stdout), pid), None
            except msgspec.DecodeError:
                error = "py-spy printed something that is not JSON"
                continue
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        error = (lines[0] if lines else f"py-spy exited with status {done.returncode}").removeprefix("Error: ")[:300]
        if process_state(pid) is None:
            break  # gone meanwhile: no second try
    return [], error


def _record(job_id: str, node: str, proc: JobProcess, request: str | None, py_spy: str) -> dict[str, Any]:
    record: dict[str, Any] = {"ts": time.time(), "job_id": job_id, "node": node, "rank": proc.rank, "pid": proc.pid}
    if proc.pid is None:
        record |= {"state": "gone", "error": f"no process of job {job_id} has rank {proc.rank} on {node}"}
    elif proc.state == "zombie":
        record |= {"state": "zombie", "error": "the process has exited; its parent has not reaped it"}
    else:
        threads, error = dump_process(py_spy, proc.pid, proc.state)
        gone = error is not None and process_state(proc.pid) is None  # it exited while being read
        record |= {"ts": time.time(), "state": "gone" if gone else proc.state, "threads": threads}
        if error is not None:
            record["error"] = error
    if request is not None:
        record["request"] = request
    return record


def dump_job(
    job_id: str,
    node: str | None = None,
    py_spy: str | Path | None = None,
    *,
    request: str | None = None,
    proc: Path = Path("/proc"),
) -> list[dict[str, Any]]:
    """Stacks records (wire contract) for job ``job_id``'s rank processes on this host, by rank.

    ``node``: the name to report (default: this host's short name); ``request``: the ``diagnose``
    action id answered. An empty list: no process of the job runs here.
    """
    spy = find_py_spy(py_spy)
    here = node or socket.gethostname().split(".")[0]
    found = job_processes(str(job_id), proc)
    if not found:
        return []
    with ThreadPoolExecutor(max_workers=min(PARALLEL_DUMPS, len(found))) as pool:
        return list(pool.map(lambda p: _record(str(job_id), here, p, request, spy), found))


class StackAgent:
    """Answers ``diagnose`` actions for this node: each action once, each job at most once per ``min_interval_s``.

    ``dump`` is :func:`dump_job` (a stand-in in tests); ``job``: answer this job's requests only.
    """

    def __init__(
        self,
        node: str,
        dump: Callable[..., list[dict[str, Any]]] = dump_job,
        job: str | None = None,
        min_interval_s: float = 30.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.node = node
        self.dump = dump
        self.job = job
        self.min_interval_s = min_interval_s
        self.clock = clock
        self._answered: OrderedDict[str, None] = OrderedDict()  # action ids, newest last (bounded)
        self._last_dump: dict[str, float] = {}  # job -> when last dumped

    def on_action(self, action: dict[str, Any]) -> list[dict[str, Any]]:
        """The stacks records answering one action record from the actions topic ([] when it is not ours)."""
        if action.get("action") != "diagnose" or action.get("status") != "applied":
            return []
        action_id, job = str(action.get("action_id") or ""), str(action.get("target") or "")
        if not action_id or not job or (self.job is not None and job != self.job) or action_id in self._answered:
            return []
        now = self.clock()
        decided = action.get("decided_at")
        if isinstance(decided, int | float) and now - decided > MAX_REQUEST_AGE_S:
            return []
        self._answered[action_id] = None
        while len(self._answered) > 10_000:
            self._answered.popitem(last=False)
        last = self._last_dump.get(job)
        if last is not None and now - last < self.min_interval_s:
            log.info("diagnose %s for job %s: dumped %.0f s ago, not again yet", action_id, job, now - last)
            return []
        self._last_dump[job] = now
        records = self.dump(job, self.node, request=action_id)
        named = [n for n in str((action.get("params") or {}).get("nodes") or "").split(",") if n]
        if not records and self.node in named:
            # Named as a suspect and nothing of the job runs here: that is the answer.
            gone = {"ts": self.clock(), "job_id": job, "node": self.node, "state": "gone", "request": action_id}
            records = [gone | {"error": f"no process of job {job} runs on {self.node}"}]
        return records


def serve(
    agent: StackAgent,
    brokers: list[str],
    actions_topic: str,
    publish: Callable[[dict[str, Any]], None],
    stop: threading.Event,
    extra: dict[str, str] | None = None,
) -> int:
    """Consume the actions topic, answer diagnose actions through ``publish``; returns the records published."""
    from confluent_kafka import Consumer

    consumer = Consumer(
        {
            "bootstrap.servers": ",".join(brokers),
            "group.id": f"trainguard-stacks-{agent.node}",  # one per node: every node sees every request
            "auto.offset.reset": "latest",  # a request from before the agent started is not answered
            **(extra or {}),
        }
    )
    consumer.subscribe([actions_topic])
    published = 0
    try:
        while not stop.is_set():
            msg = consumer.poll(0.5)
            if msg is None or msg.error() is not None or msg.value() is None:
                continue
            try:
                action = msgspec.json.decode(msg.value())
            except msgspec.DecodeError:
                continue
            if isinstance(action, dict):
                for record in agent.on_action(action):
                    publish(record)
                    published += 1
    finally:
        consumer.close()
    return published
