"""No-progress (hang) detection with a learned step interval.

The deadline after the last step is ``max(floor_s, factor × q90 of recent step
intervals)`` (NVRx uses a safety factor of 5). Before ``warmup_steps`` steps
have been seen the much longer ``startup_grace_s`` applies: first steps compile
kernels and warm the dataloader. A checkpoint save or evaluation phase moves the
deadline to ``pause_grace_s`` after its start, and its end restarts the normal
deadline, so benign pauses are not hangs.

>>> det = HangDetector(floor_s=55, warmup_steps=2)
>>> for step in range(1, 6):
...     det.observe_progress(ts=1000.0 + 2 * step, step=step, rank=0, node="n1")
>>> det.deadline()
1065.0
>>> det.advance(1060.0) is None, det.advance(1065.0).category
(True, 'no_progress')
"""

from __future__ import annotations

from collections import deque

from detectors.findings import Finding


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class HangDetector:
    """Fires once per stall when no step is made by the learned deadline."""

    def __init__(
        self,
        floor_s: float = 55.0,
        factor: float = 5.0,
        warmup_steps: int = 3,
        startup_grace_s: float = 600.0,
        pause_grace_s: float = 900.0,
        window: int = 50,
    ) -> None:
        self.floor_s = floor_s
        self.factor = factor
        self.warmup_steps = warmup_steps
        self.startup_grace_s = startup_grace_s
        self.pause_grace_s = pause_grace_s
        self._intervals: deque[float] = deque(maxlen=window)
        self._step = -1
        self._steps_seen = 0
        self._last_advance: float | None = None
        self._rank_last: dict[int, tuple[float, str]] = {}
        self._pause_since: float | None = None
        self._fired = False

    # -- inputs ---------------------------------------------------------------
    def observe_progress(self, ts: float, step: int, rank: int | None, node: str) -> None:
        if rank is not None:
            prev = self._rank_last.get(rank)
            if prev is None or ts >= prev[0]:
                self._rank_last[rank] = (ts, node)
        if step < self._step:  # restarted from a checkpoint: warm up again
            self.restart(ts)
        if step <= self._step:
            return
        if self._last_advance is not None and self._pause_since is None and self._steps_seen >= self.warmup_steps:
            self._intervals.append((ts - self._last_advance) / (step - self._step))
        self._step = step
        self._steps_seen += 1
        self._last_advance = ts if self._last_advance is None else max(ts, self._last_advance)
        # A step clearly after the pause began ends it (some frameworks log no
        # end marker); records of the step just before the marker arrive a
        # little after it and must not.
        if self._pause_since is not None and ts >= self._pause_since + max(2.0, self.interval() or 0.0):
            self._pause_since = None
        self._fired = False

    def observe_phase(self, ts: float, starts: bool) -> None:
        if starts:
            self._pause_since = ts
        elif self._pause_since is not None:
            self._pause_since = None
            # The pause is over: measure the next stall from its end.
            self._last_advance = max(ts, self._last_advance or ts)

    def restart(self, ts: float) -> None:
        """The job (re)started: forget stall state and warm up again."""
        self._step = -1
        self._steps_seen = 0
        self._last_advance = ts
        self._pause_since = None
        self._fired = False
        self._rank_last.clear()

    def stop(self) -> None:
        """The job ended: nothing to wait for."""
        self._last_advance = None
        self._pause_since = None

    # -- clock ------------------------------------------------------------------
    def interval(self) -> float | None:
        return _quantile(list(self._intervals), 0.9) if self._intervals else None

    def deadline(self) -> float | None:
        if self._last_advance is None or self._fired:
            return None
        if self._pause_since is not None:
            return max(self._pause_since + self.pause_grace_s, self._last_advance + self.floor_s)
        interval = self.interval()
        if self._steps_seen < self.warmup_steps or interval is None:
            return self._last_advance + self.startup_grace_s
        return self._last_advance + max(self.floor_s, self.factor * interval)

    def advance(self, watermark: float) -> Finding | None:
        deadline = self.deadline()
        if deadline is None or watermark < deadline:
            return None
        self._fired = True
        assert self._last_advance is not None
        nodes, ranks, confidence = self._localise()
        interval = self.interval()
        evidence = [
            f"no step for {watermark - self._last_advance:.0f}s after step {self._step}"
            + (f" (learned interval {interval:.2f}s)" if interval else " (during warm-up)")
        ]
        if self._pause_since is not None:
            evidence.append(f"a checkpoint/eval phase began at {self._pause_since:.0f} and never ended")
        return Finding(
            kind="hang",
            category="no_progress",
            layer="unknown",
            onset_ts=self._last_advance,
            detected_at=watermark,
            nodes=nodes,
            ranks=ranks,
            confidence=confidence,
            evidence=evidence,
        )

    def _localise(self) -> tuple[list[str], list[int], float]:
        """Ranks whose last step is clearly older than their peers' stopped first."""
        if len(self._rank_last) < 2:
            return [], [], 0.6
        newest = max(ts for ts, _ in self._rank_last.values())
        slack = max(1.0, 0.5 * (self.interval() or 0.0))
        behind = sorted(r for r, (ts, _) in self._rank_last.items() if ts < newest - slack)
        if not behind or len(behind) == len(self._rank_last):
            return [], [], 0.6
        nodes = sorted({self._rank_last[r][1] for r in behind})
        return nodes, behind, 0.8
