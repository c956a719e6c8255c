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

Pipeline-parallel jobs: ranks :meth:`~RankScorer.place`\\ d in a stage are compared
after dividing their times by their stage's pace (:mod:`detectors.pipeline`), so a
stage that is slower by design blames no rank; it is reported once, as a
``pipeline_imbalance`` warning, by :meth:`~RankScorer.evaluate`.

>>> scorer = RankScorer(window=3, consecutive=2)
>>> for rank in range(4):
...     scorer.place(rank, stage=rank // 2, dp_rank=rank % 2)
>>> found = []
>>> for step in range(12):
...     for rank in range(4):
...         scorer.observe(rank, f"n{rank}", 1.6 if rank >= 2 else 1.0)  # stage 1 is heavier
...     found.append(scorer.evaluate(float(step)))
>>> [(f.category, f.severity, f.ranks) for f in found if f]
[('pipeline_imbalance', 'warning', [])]
"""

from __future__ import annotations

from collections import deque
from statistics import median

from trainguard.detectors.findings import Finding
from trainguard.detectors.pipeline import StageBalance


class RankScorer:
    """Relative and individual scores per rank, with episode-level reporting."""

    def __init__(
        self,
        threshold: float = 0.75,
        window: int = 5,
        consecutive: int = 5,
        min_ranks: int = 2,
        reference: str = "median",
        imbalance_ratio: float = 1.25,
    ) -> None:
        self.threshold = threshold
        self.reference = reference
        self.window = window
        self.consecutive = consecutive
        self.min_ranks = min_ranks
        self.imbalance_ratio = imbalance_ratio
        # Where ranks sit in the pipeline: the job's layout, kept across restarts.
        self._stage: dict[int, int] = {}
        self._dp_rank: dict[int, int] = {}
        self._imbalance_reported = False
        self._start_run()

    def __setstate__(self, state: dict[str, object]) -> None:
        # Snapshots written before pipeline stages were known still resume.
        state.setdefault("imbalance_ratio", 1.25)
        state.setdefault("_stage", {})
        state.setdefault("_dp_rank", {})
        state.setdefault("_imbalance_reported", False)
        state.setdefault("_pending", None)
        if "_balance" not in state:
            state["_balance"] = StageBalance(int(state.get("consecutive", 5)), float(state["imbalance_ratio"]))  # type: ignore[call-overload]
        self.__dict__.update(state)

    def _start_run(self) -> None:
        self._times: dict[int, deque[float]] = {}
        self._node: dict[int, str] = {}
        self._best: dict[int, float] = {}
        self._below: dict[int, int] = {}
        self._above: dict[int, int] = {}
        self._first_below: dict[int, float] = {}
        self._flagged: set[int] = set()
        self._balance = StageBalance(self.consecutive, self.imbalance_ratio)
        self._pending: Finding | None = None

    def place(self, rank: int, stage: int | None, dp_rank: int | None = None) -> None:
        """Record ``rank``'s pipeline stage (and data-parallel replica, for evidence); idempotent."""
        if stage is not None:
            self._stage[rank] = stage
        if dp_rank is not None:
            self._dp_rank[rank] = dp_rank

    def observe(self, rank: int, node: str, seconds: float) -> None:
        times = self._times.get(rank)
        if times is None:
            times = self._times[rank] = deque(maxlen=self.window)
        times.append(seconds)
        self._node[rank] = node

    def reset(self) -> None:
        """A new run of the job (restart, requeue): forget timings, relearn stage paces."""
        self._start_run()

    def _medians(self) -> dict[int, float]:
        """Each full window's median: ``statistics.median``'s arithmetic, without its call per rank (this runs
        for every rank of every job at each evaluation)."""
        window = self.window
        mid = window // 2
        if window % 2:
            return {r: sorted(t)[mid] for r, t in self._times.items() if len(t) == window}
        return {r: (s[mid - 1] + s[mid]) / 2 for r, t in self._times.items() if len(t) == window for s in (sorted(t),)}

    def scores(self) -> dict[int, tuple[float, float]]:
        """``rank -> (relative, individual)`` for ranks with a full window.

        The relative score compares stage-normalised times: a rank's median over its
        stage's pace (1 for ranks of no known stage).
        """
        medians = self._medians()
        if len(medians) < self.min_ranks:
            return {}
        stage_of = self._stage
        if stage_of:
            paces = self._balance.paces(medians, stage_of)
            norm = {r: m / (paces.get(stage_of[r], 1.0) if r in stage_of else 1.0) for r, m in medians.items()}
        else:  # no rank in a known stage: every rank's pace is 1, and m / 1.0 is m
            norm = medians
        ref = min(norm.values()) if self.reference == "fastest" else median(norm.values())
        out = {}
        best_of = self._best
        for rank, m in medians.items():
            best = best_of.get(rank, m)
            if m < best:  # min(best, m), without the call
                best = m
            best_of[rank] = best
            n = norm[rank]
            out[rank] = (min(1.0, ref / n) if n > 0 else 1.0, best / m if m > 0 else 1.0)
        return out

    def slowest(self) -> tuple[int, str, float] | None:
        """The rank with the lowest relative score right now: ``(rank, node, score)``."""
        scores = self.scores()
        if not scores:
            return None
        rank = min(scores, key=lambda r: scores[r][0])
        return rank, self._node[rank], scores[rank][0]

    def where(self, rank: int) -> str:
        """``rank 0 (dp_rank 0, pp stage 0)``, with what is known of its place.

        >>> s = RankScorer(); s.place(4, stage=1, dp_rank=0); (s.where(4), s.where(5))
        ('rank 4 (dp_rank 0, pp stage 1)', 'rank 5')
        """
        place = [f"dp_rank {self._dp_rank[rank]}"] if rank in self._dp_rank else []
        place += [f"pp stage {self._stage[rank]}"] if rank in self._stage else []
        return f"rank {rank}" + (f" ({', '.join(place)})" if place else "")

    def evaluate(self, ts: float) -> Finding | None:
        """Score every rank once (call once per step); a finding when a straggler episode starts.

        While stage paces are being learnt, a stage slower by design is reported as a
        ``pipeline_imbalance`` warning; should a straggler start at that same evaluation,
        the warning follows at the next one (one finding per evaluation).
        """
        if self._stage and self._balance.frozen is None:  # pipeline jobs, while stage paces are learnt
            imbalance = self._balance.learn(ts, self._medians(), self._stage)
            if imbalance is not None and not self._imbalance_reported:
                self._pending = imbalance
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
            if self._pending is not None:
                self._imbalance_reported = True
                pending, self._pending = self._pending, None
                return pending
            return None
        new.sort(key=lambda r: scores[r][0])
        peers = "stage-normalised, " if any(r in self._stage for r in new) else ""
        evidence = [
            f"{self.where(r)} on {self._node[r]}: relative score {scores[r][0]:.2f}, individual {scores[r][1]:.2f} "
            f"({peers}threshold {self.threshold:g})"
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
