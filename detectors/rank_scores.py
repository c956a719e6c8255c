"""NVRx-style per-rank performance scores from per-rank timings.

Each rank's recent timing (compute time, or step time where ranks do not wait
for each other) is summarised by a rolling median. The **relative** score is the
reference median over this rank's, the
**individual** score is the rank's own best median over its current one. A rank
whose relative score stays below ``threshold`` (NVRx's default 0.75) for
``consecutive`` evaluations in a row is a straggler; the episode ends after as
many evaluations back above it.

NVRx takes the *fastest* rank as the reference; by default this takes the
*median* rank (``reference="median"``): on the real PAI traces a fast outlier
otherwise makes ordinary ranks look 25 % slow (job_1, worker 4 at t≈150).

>>> scorer = RankScorer(window=3, consecutive=2)
>>> found = []
>>> for step in range(10):
...     for rank in range(4):
...         scorer.observe(rank, f"n{rank}", 1.0 if rank != 2 or step < 5 else 1.8)
...     found.append(scorer.evaluate(float(step)))
>>> [(f.ranks, f.nodes) for f in found if f]
[([2], ['n2'])]
"""

from __future__ import annotations

from collections import deque
from statistics import median

from detectors.findings import Finding


class RankScorer:
    """Relative and individual scores per rank, with episode-level reporting."""

    def __init__(
        self,
        threshold: float = 0.75,
        window: int = 5,
        consecutive: int = 5,
        min_ranks: int = 2,
        reference: str = "median",
    ) -> None:
        self.threshold = threshold
        self.reference = reference
        self.window = window
        self.consecutive = consecutive
        self.min_ranks = min_ranks
        self._times: dict[int, deque[float]] = {}
        self._node: dict[int, str] = {}
        self._best: dict[int, float] = {}
        self._below: dict[int, int] = {}
        self._above: dict[int, int] = {}
        self._first_below: dict[int, float] = {}
        self._flagged: set[int] = set()

    def observe(self, rank: int, node: str, seconds: float) -> None:
        times = self._times.get(rank)
        if times is None:
            times = self._times[rank] = deque(maxlen=self.window)
        times.append(seconds)
        self._node[rank] = node

    def reset(self) -> None:
        self.__init__(self.threshold, self.window, self.consecutive, self.min_ranks, self.reference)  # type: ignore[misc]

    def scores(self) -> dict[int, tuple[float, float]]:
        """``rank -> (relative, individual)`` for ranks with a full window."""
        medians = {r: median(t) for r, t in self._times.items() if len(t) == self.window}
        if len(medians) < self.min_ranks:
            return {}
        ref = min(medians.values()) if self.reference == "fastest" else median(medians.values())
        out = {}
        for rank, m in medians.items():
            best = self._best[rank] = min(self._best.get(rank, m), m)
            out[rank] = (min(1.0, ref / m) if m > 0 else 1.0, best / m if m > 0 else 1.0)
        return out

    def slowest(self) -> tuple[int, str, float] | None:
        """The rank with the lowest relative score right now: ``(rank, node, score)``."""
        scores = self.scores()
        if not scores:
            return None
        rank = min(scores, key=lambda r: scores[r][0])
        return rank, self._node[rank], scores[rank][0]

    def evaluate(self, ts: float) -> Finding | None:
        """Score every rank once (call once per step); a finding when a straggler episode starts."""
        scores = self.scores()
        new: list[int] = []
        for rank, (relative, _individual) in scores.items():
            if relative < self.threshold:
                self._above[rank] = 0
                self._below[rank] = self._below.get(rank, 0) + 1
                self._first_below.setdefault(rank, ts)
                if self._below[rank] >= self.consecutive and rank not in self._flagged:
                    self._flagged.add(rank)
                    new.append(rank)
            else:
                self._below[rank] = 0
                self._first_below.pop(rank, None)
                self._above[rank] = self._above.get(rank, 0) + 1
                if self._above[rank] >= self.consecutive:
                    self._flagged.discard(rank)
        if not new:
            return None
        new.sort(key=lambda r: scores[r][0])
        evidence = [
            f"rank {r} on {self._node[r]}: relative score {scores[r][0]:.2f}, individual {scores[r][1]:.2f} "
            f"(threshold {self.threshold:g})"
            for r in new
        ]
        return Finding(
            kind="straggler",
            category="slow_rank",
            layer="unknown",
            onset_ts=min(self._first_below[r] for r in new),
            detected_at=ts,
            nodes=sorted({self._node[r] for r in new}),
            ranks=new,
            confidence=0.85,
            evidence=evidence,
        )
