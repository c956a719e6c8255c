"""Progress probe: a training script reports each step, per rank, without ever waiting on it.

>>> import tempfile, pathlib, json
>>> path = pathlib.Path(tempfile.mkdtemp()) / "progress.jsonl"
>>> probe = ProgressProbe(job_id="42", node="gpu-node-01", rank=3, path=path)
>>> probe.step(1, step_time_s=1.02, compute_time_s=0.71)
>>> probe.close()
>>> record = json.loads(path.read_text())
>>> record["job_id"], record["rank"], record["step"], record["compute_time_s"]
('42', 3, 1, 0.71)

``step()`` only puts a record on a bounded queue; a background thread publishes
(to Kafka, or to a JSON Lines file). When the queue is full — the broker is slow or
gone — records are dropped and counted in :attr:`ProgressProbe.dropped`: the probe
never slows training, and a crash in it never reaches the training loop.
Job, node and rank default to what Slurm and torchrun put in the environment
(``TRAINGUARD_JOB_ID`` first, where a launcher sets the job id itself).

When nothing was sent for ``beat_s`` seconds (5 by default; 0 turns beats off), the same
thread sends a *beat*: the last step again, with ``"beat": true``. Beats say the process is alive, not that
it progresses: a rank blocked in a collective keeps beating (the collective releases the
GIL), a rank that was stopped, frozen or killed does not — which is how a hang is pinned on
it without GPU telemetry. Every record carries the process id, so a launcher's
"pid 5109 failed" names the rank.
"""

from __future__ import annotations

import contextlib
import os
import queue
import socket
import threading
import time
from pathlib import Path
from typing import Any

import msgspec


class ProgressProbe:
    """Non-blocking per-rank progress reporter."""

    def __init__(
        self,
        job_id: str | None = None,
        node: str | None = None,
        rank: int | None = None,
        brokers: str | None = None,
        topic: str = "progress",
        path: str | Path | None = None,
        max_queue: int = 10_000,
        beat_s: float = 5.0,
    ) -> None:
        env = os.environ
        self.job_id = (
            job_id
            or env.get("TRAINGUARD_JOB_ID")
            or env.get("SLURM_JOB_ID")
            or env.get("TORCHELASTIC_RUN_ID")
            or "unknown"
        )
        self.node = node or env.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]
        self.rank = rank if rank is not None else int(env.get("RANK", env.get("SLURM_PROCID", "0")))
        self.pid = os.getpid()
        self.beat_s = beat_s
        self.dropped = 0
        self._last_step = 0
        self.sent = 0
        self.errors = 0
        self._queue: queue.Queue[dict[str, Any] | None] = queue.Queue(maxsize=max_queue)
        self._encode = msgspec.json.Encoder().encode
        self._producer = None
        self._file = None
        self._topic = topic
        brokers = brokers or env.get("TRAINGUARD_BROKERS")
        if path is not None:
            self._file = open(path, "ab")  # noqa: SIM115 - closed by close()
        elif brokers:
            from confluent_kafka import Producer

            self._producer = Producer({"bootstrap.servers": brokers, "linger.ms": 50, "queue.buffering.max.ms": 50})
        else:
            raise ValueError("ProgressProbe needs brokers= (or TRAINGUARD_BROKERS) or path= to publish to.")
        self._thread = threading.Thread(target=self._send_loop, name="trainguard-probe", daemon=True)
        self._thread.start()

    def step(
        self,
        step: int,
        step_time_s: float | None = None,
        compute_time_s: float | None = None,
        tokens_per_s: float | None = None,
        samples_per_s: float | None = None,
    ) -> None:
        """Report that this rank finished ``step``; returns at once."""
        self._last_step = int(step)
        record = {"ts": time.time(), "job_id": self.job_id, "node": self.node, "rank": self.rank, "step": int(step)}
        record["pid"] = self.pid
        for name, value in (
            ("step_time_s", step_time_s),
            ("compute_time_s", compute_time_s),
            ("tokens_per_s", tokens_per_s),
            ("samples_per_s", samples_per_s),
        ):
            if value is not None:
                record[name] = float(value)
        try:
            self._queue.put_nowait(record)
        except queue.Full:
            self.dropped += 1

    def _beat(self) -> dict[str, Any]:
        return {
            "ts": time.time(),
            "job_id": self.job_id,
            "node": self.node,
            "rank": self.rank,
            "step": self._last_step,
            "pid": self.pid,
            "beat": True,
        }

    def _send_loop(self) -> None:
        while True:
            try:
                record = self._queue.get(timeout=self.beat_s if self.beat_s > 0 else None)
            except queue.Empty:  # nothing sent for beat_s: say this process is still alive
                record = self._beat()
            if record is None:
                break
            try:
                payload = self._encode(record)
                if self._file is not None:
                    self._file.write(payload + b"\n")
                    self._file.flush()
                else:
                    assert self._producer is not None
                    self._producer.produce(self._topic, payload, key=str(record["job_id"]).encode())
                    self._producer.poll(0)
                self.sent += 1
            except Exception:  # a probe must never take training down: count and carry on
                self.errors += 1

    def close(self, timeout_s: float = 5.0) -> None:
        """Flush what is queued (up to ``timeout_s``) and stop."""
        with contextlib.suppress(queue.Full):
            self._queue.put(None, timeout=timeout_s)
        self._thread.join(timeout_s)
        if self._producer is not None:
            self._producer.flush(timeout_s)
        if self._file is not None:
            self._file.close()


class HFProgressCallback:
    """A Hugging Face ``Trainer`` callback: ``Trainer(..., callbacks=[HFProgressCallback(probe)])``.

    Duck-typed (every ``on_*`` hook the Trainer calls exists), so transformers need not be
    imported here; it reports ``state.global_step`` and the wall time of each step.
    """

    def __init__(self, probe: ProgressProbe) -> None:
        self.probe = probe
        self._started: float | None = None

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._started = time.perf_counter()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        elapsed = None if self._started is None else time.perf_counter() - self._started
        self.probe.step(state.global_step, step_time_s=elapsed)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.probe.close()

    def __getattr__(self, name: str) -> Any:
        if name.startswith("on_"):
            return lambda *args, **kwargs: None
        raise AttributeError(name)


def lightning_callback(probe: ProgressProbe) -> Any:
    """A PyTorch Lightning ``Callback`` reporting ``trainer.global_step`` after every training batch."""
    from lightning.pytorch import Callback  # imported here: only Lightning users need Lightning

    class _ProgressCallback(Callback):  # type: ignore[misc]
        def on_train_batch_start(self, trainer: Any, *args: Any) -> None:
            self._started = time.perf_counter()

        def on_train_batch_end(self, trainer: Any, *args: Any) -> None:
            started = getattr(self, "_started", None)
            probe.step(trainer.global_step, step_time_s=None if started is None else time.perf_counter() - started)

        def on_train_end(self, trainer: Any, *args: Any) -> None:
            probe.close()

    return _ProgressCallback()
