"""Run a dataflow on several local worker processes and gather its outputs in this one.

Python detectors hold the GIL, so Bytewax worker *threads* share one core; worker
*processes* do not. :func:`run_processes` forks ``processes`` children that form
one Bytewax cluster over loopback (free ports, chosen here), each building the
flow itself. Whatever the flow hands its callbacks in a child comes back through
a queue and is passed to the caller's callbacks, so a multi-process replay
reports exactly like a single-process one. Sinks that write (the Parquet archive,
Kafka, the audit log) run in the child that owns them.
"""

from __future__ import annotations

import dataclasses
import math
import multiprocessing as mp
import queue
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from datetime import timedelta
from pathlib import Path
from typing import Any, TypeVar

from bytewax.dataflow import Dataflow

from trainguard.dataflows.flow import Outputs
from trainguard.dataflows.ports import free_ports

_DONE = "done"
T = TypeVar("T")


def map_in_processes(fn: Callable[..., T], calls: Sequence[tuple[Any, ...]], processes: int) -> list[T]:
    """``fn(*args)`` for each ``args`` of ``calls``, in their order: up to ``processes`` at once, each in a
    worker process of its own (one call here, in this process, when one process is asked for or one call).

    The workers are started fresh (``spawn``): a forked copy of a process whose polars or Bytewax threads
    hold a lock could wait on it forever. ``fn`` must be importable by name, its arguments picklable.
    """
    workers = min(processes, len(calls))
    if workers <= 1:
        return [fn(*args) for args in calls]
    with ProcessPoolExecutor(workers, mp_context=mp.get_context("spawn")) as pool:
        return list(pool.map(fn, *zip(*calls, strict=True)))


class WorkerProcessError(RuntimeError):
    """A worker process failed; the message says which and how."""


def _listening(port: int) -> bool | None:
    """Whether something listens on loopback ``port`` (Linux's socket table; ``None`` elsewhere)."""
    try:
        table = Path("/proc/net/tcp").read_text()
    except OSError:
        return None
    # Columns: sl, local_address (hex ip:hex port), rem_address, st (0A = LISTEN), ...
    return any(
        fields[1].endswith(f":{port:04X}") and fields[3] == "0A" for fields in map(str.split, table.splitlines()[1:])
    )


def _wait_listening(port: int, child: Any, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and child.is_alive():
        if _listening(port) is not False:  # listening, or no way to tell here (the workers' own retries will do)
            return
        time.sleep(0.005)


def _forwarder(channel: Any, name: str) -> Callable[[list[Any]], None]:
    def forward(items: list[Any]) -> None:
        channel.put((name, items))

    return forward


def _child(
    build: Callable[[Outputs], Dataflow], outputs: Outputs, index: int, addresses: list[str], channel: Any
) -> None:
    from bytewax.testing import cluster_main

    from trainguard.dataflows.pipeline import NO_SNAPSHOTS_S, engine_runtime

    try:
        child_outputs = dataclasses.replace(
            outputs,
            on_anomalies=_forwarder(channel, "anomalies") if outputs.on_anomalies else None,
            on_actions=_forwarder(channel, "actions") if outputs.on_actions else None,
            on_dead_letters=_forwarder(channel, "dead_letters") if outputs.on_dead_letters else None,
        )
        # No recovery here: epochs that never end before the input, so no snapshot is taken for nothing.
        epoch = timedelta(seconds=NO_SNAPSHOTS_S)
        with engine_runtime():
            cluster_main(build(child_outputs), addresses, index, epoch_interval=epoch, worker_count_per_proc=1)
    except BaseException as exc:  # reported to the parent, which raises
        channel.put((_DONE, f"worker process {index} failed: {type(exc).__name__}: {exc}"))
        raise SystemExit(1) from None
    channel.put((_DONE, None))


def run_processes(
    build: Callable[[Outputs], Dataflow], processes: int, outputs: Outputs, timeout_s: float | None = None
) -> None:
    """Run ``build(outputs)`` on ``processes`` local worker processes; return when all have finished.

    ``build`` is called in each child (after ``fork``) with outputs whose callbacks
    forward to this process. Raises :class:`WorkerProcessError` if any child fails,
    or if they have not all finished after ``timeout_s``.
    """
    deadline = math.inf if timeout_s is None else time.monotonic() + timeout_s
    context = mp.get_context("fork")  # the children inherit `build` and its closures as they are
    channel = context.Queue()
    ports = free_ports(processes)
    addresses = [f"127.0.0.1:{port}" for port in ports]
    children = [
        context.Process(target=_child, args=(build, outputs, i, addresses, channel), name=f"trainguard-worker-{i}")
        for i in range(processes)
    ]
    for i, child in enumerate(children):
        child.start()
        # Worker i dials workers 0..i-1 and, finding one not yet listening, sleeps a
        # whole second before it tries again: start each once the one before listens
        # (the last has no one to wait for it).
        if i < processes - 1:
            _wait_listening(ports[i], child)
    handlers = {
        "anomalies": outputs.on_anomalies,
        "actions": outputs.on_actions,
        "dead_letters": outputs.on_dead_letters,
    }
    failures: list[str] = []
    finished = 0
    try:
        while finished < processes:
            if time.monotonic() > deadline:
                failures.append(f"the worker processes did not finish within {timeout_s:g}s")
                break
            try:
                name, payload = channel.get(timeout=1.0)
            except queue.Empty:
                dead = [c for c in children if c.exitcode not in (None, 0)]
                if dead:  # killed before it could say so
                    failures += [f"worker process {c.name} exited with status {c.exitcode}" for c in dead]
                    break
                continue
            if name == _DONE:
                finished += 1
                if payload is not None:
                    failures.append(payload)
                    break  # the others cannot finish without it
                continue
            handler = handlers[name]
            if handler is not None:
                handler(payload)
    finally:
        for child in children:
            if failures:
                child.terminate()
            child.join()
    if failures:
        raise WorkerProcessError(failures[0])
