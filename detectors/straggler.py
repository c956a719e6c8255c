"""Job-level straggler detection: sustained step-time rise against the job's own baseline.

In synchronous training every rank waits for the slowest, so a slow GPU shows
as a job-wide rise in step time. The detector keeps a rolling median of recent
normal step times and fires when ``consecutive`` steps in a row are slower than
``ratio`` × that baseline. Steps that span a checkpoint or evaluation phase, and
warm-up steps, are ignored. Localising the slow rank or GPU is the job
monitor's business (per-rank scores, GPU peer comparison).

>>> det = StragglerDetector(baseline_steps=5, consecutive=3)
>>> found = [det.observe_step(ts=float(i), step_time=1.0 if i < 10 else 1.6) for i in range(14)]
>>> [f.category for f in found if f]
['slow_job']
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from statistics import median

from trainguard.detectors.findings import Finding


class StragglerDetector:
    """Fires once per slow episode; the episode ends after ``consecutive`` normal steps."""

    def __init__(
        self, ratio: float = 1.25, consecutive: int = 5, baseline_steps: int = 30, warmup_steps: int = 5
    ) -> None:
        self.ratio = ratio
        self.consecutive = consecutive
        self.warmup_steps = warmup_steps
        self._baseline: deque[float] = deque(maxlen=baseline_steps)
        # The baseline kept sorted too, for its median at every step (None: a step time that is not a finite
        # number came, which no order can place: the median is then taken the slow way).
        self._sorted: list[float] | None = []
        self._seen = 0
        self._slow_run: list[tuple[float, float]] = []
        self._normal_run = 0
        self._in_episode = False

    def __setstate__(self, state: dict[str, object]) -> None:
        if "_sorted" not in state:  # a snapshot from before the sorted copy
            baseline: deque[float] = state["_baseline"]  # type: ignore[assignment]
            state["_sorted"] = sorted(baseline) if all(math.isfinite(t) for t in baseline) else None
        self.__dict__.update(state)

    def restart(self) -> None:
        self._seen = 0
        self._slow_run.clear()
        self._normal_run = 0
        self._in_episode = False

    def observe_step(self, ts: float, step_time: float) -> Finding | None:
        """One step's duration (seconds); returns a finding when an episode starts."""
        self._seen += 1
        if self._seen <= self.warmup_steps or step_time <= 0:
            return None
        if len(self._baseline) < self._baseline.maxlen // 2:  # type: ignore[operator]
            self._learn(step_time)
            return None
        base = self._median()
        if step_time > self.ratio * base:
            self._slow_run.append((ts, step_time))
            self._normal_run = 0
            if not self._in_episode and len(self._slow_run) >= self.consecutive:
                self._in_episode = True
                return self._finding(ts, base)
            return None
        self._normal_run += 1
        self._learn(step_time)
        if self._normal_run >= self.consecutive:
            self._slow_run.clear()
            self._in_episode = False
        elif not self._in_episode and self._slow_run:
            self._slow_run.clear()
        return None

    def _learn(self, step_time: float) -> None:
        """A normal step's time joins the baseline (the oldest leaves a full one)."""
        baseline, kept = self._baseline, self._sorted
        if kept is not None:
            if not math.isfinite(step_time):
                self._sorted = None
            else:
                if len(baseline) == baseline.maxlen:
                    del kept[bisect.bisect_left(kept, baseline[0])]
                bisect.insort(kept, step_time)
        baseline.append(step_time)

    def _median(self) -> float:
        """``statistics.median`` of the baseline, from its sorted copy."""
        kept = self._sorted
        if not kept:
            return median(self._baseline)
        n = len(kept)
        return kept[n // 2] if n % 2 else (kept[n // 2 - 1] + kept[n // 2]) / 2

    def _finding(self, ts: float, base: float) -> Finding:
        slow = median(t for _, t in self._slow_run)
        return Finding(
            kind="straggler",
            category="slow_job",
            layer="unknown",
            onset_ts=self._slow_run[0][0],
            detected_at=ts,
            confidence=0.5,
            evidence=[
                f"step time {slow:.2f}s vs baseline {base:.2f}s ({slow / base:.2f}×) for {len(self._slow_run)} steps"
            ],
        )
