"""Job-level straggler detection: sustained step-time rise against the job's own baseline.

In synchronous training every rank waits for the slowest, so a slow GPU shows
as a job-wide rise in step time. The detector keeps a rolling median of recent
normal step times and fires when ``consecutive`` steps in a row are slower than
``ratio`` × that baseline. Steps that span a checkpoint or evaluation phase, and
warm-up steps, are ignored. The slow rank is localised by per-rank
``compute_time_s`` (time outside collective waits), when producers send it: the
odd one out against the median of its peers.

>>> det = StragglerDetector(baseline_steps=5, consecutive=3)
>>> found = [det.observe_step(ts=float(i), step_time=1.0 if i < 10 else 1.6) for i in range(14)]
>>> [f.category for f in found if f]
['slow_job']
"""

from __future__ import annotations

from collections import deque
from statistics import median

from detectors.crash import Finding


class StragglerDetector:
    """Fires once per slow episode; the episode ends after ``consecutive`` normal steps."""

    def __init__(
        self,
        ratio: float = 1.25,
        consecutive: int = 5,
        baseline_steps: int = 30,
        warmup_steps: int = 5,
        rank_ratio: float = 1.15,
        rank_window: int = 5,
    ) -> None:
        self.ratio = ratio
        self.consecutive = consecutive
        self.warmup_steps = warmup_steps
        self.rank_ratio = rank_ratio
        self._baseline: deque[float] = deque(maxlen=baseline_steps)
        self._rank_compute: dict[int, deque[float]] = {}
        self._rank_node: dict[int, str] = {}
        self._rank_window = rank_window
        self._seen = 0
        self._slow_run: list[tuple[float, float]] = []
        self._normal_run = 0
        self._in_episode = False

    def observe_compute(self, rank: int, node: str, compute_time_s: float) -> None:
        window = self._rank_compute.get(rank)
        if window is None:
            window = self._rank_compute[rank] = deque(maxlen=self._rank_window)
        window.append(compute_time_s)
        self._rank_node[rank] = node

    def restart(self) -> None:
        self._seen = 0
        self._slow_run.clear()
        self._normal_run = 0
        self._in_episode = False
        self._rank_compute.clear()

    def observe_step(self, ts: float, step_time: float) -> Finding | None:
        """One step's duration (seconds); returns a finding when an episode starts."""
        self._seen += 1
        if self._seen <= self.warmup_steps or step_time <= 0:
            return None
        if len(self._baseline) < self._baseline.maxlen // 2:  # type: ignore[operator]
            self._baseline.append(step_time)
            return None
        base = median(self._baseline)
        if step_time > self.ratio * base:
            self._slow_run.append((ts, step_time))
            self._normal_run = 0
            if not self._in_episode and len(self._slow_run) >= self.consecutive:
                self._in_episode = True
                return self._finding(ts, base)
            return None
        self._normal_run += 1
        self._baseline.append(step_time)
        if self._normal_run >= self.consecutive:
            self._slow_run.clear()
            self._in_episode = False
        elif not self._in_episode:
            self._slow_run.clear()
        return None

    def _finding(self, ts: float, base: float) -> Finding:
        slow = median(t for _, t in self._slow_run)
        ranks, nodes, confidence = self._odd_rank_out()
        evidence = [
            f"step time {slow:.2f}s vs baseline {base:.2f}s ({slow / base:.2f}×) for {len(self._slow_run)} steps"
        ]
        if ranks:
            evidence.append(f"rank {ranks[0]} on {nodes[0]} has the slowest compute time")
        return Finding(
            kind="straggler",
            category="slow_rank" if ranks else "slow_job",
            layer="unknown",
            onset_ts=self._slow_run[0][0],
            detected_at=ts,
            nodes=nodes,
            ranks=ranks,
            confidence=confidence,
            evidence=evidence,
        )

    def _odd_rank_out(self) -> tuple[list[int], list[str], float]:
        if len(self._rank_compute) < 2:
            return [], [], 0.5
        medians = {r: median(w) for r, w in self._rank_compute.items() if w}
        worst = max(medians, key=medians.__getitem__)
        peers = [m for r, m in medians.items() if r != worst]
        if medians[worst] > self.rank_ratio * median(peers):
            return [worst], [self._rank_node[worst]], 0.85
        return [], [], 0.5
