"""Pipeline-parallel stage balance: which slowness is the job's partitioning, not a worker.

In synchronous pipeline parallelism every micro-batch passes through every stage, and stages
differ by design: the first holds the embedding, the last the output layer and the loss, and
layers rarely split evenly. So:

- a stage whose ranks are **all** slower, on every data-parallel replica, consistently from
  the start, is a property of how the job was partitioned: a configuration matter for its
  owner (rebalance the layers), worth a warning, never a node to drain;
- **one** rank slower than the peers of its own stage is a worker issue.

:class:`StageBalance` learns each stage's *pace* (its typical compute time over the fastest
stage's) during the first evaluations of a run, then freezes it. The rank scorer divides each
rank's compute time by its stage's pace before comparing ranks, so the ranks of a heavy stage
are not blamed for it, while a rank that slows later still stands out, even the only rank of
its stage. A job with a single data-parallel replica cannot tell a rank sick from the start
from a heavy stage; it gets the warning, not a drain.

>>> balance = StageBalance(snapshots=2)
>>> stage_of = {0: 0, 1: 0, 2: 1, 3: 1}
>>> balance.learn(1.0, {0: 1.0, 1: 1.0, 2: 1.6, 3: 1.6}, stage_of) is None
True
>>> f = balance.learn(2.0, {0: 1.0, 1: 1.0, 2: 1.6, 3: 1.7}, stage_of)
>>> (f.kind, f.category, f.layer, f.severity, f.ranks), balance.frozen
(('imbalance', 'pipeline_imbalance', 'application', 'warning', []), {0: 1.0, 1: 1.6})
"""

from __future__ import annotations

from collections.abc import Mapping
from statistics import median, median_low

from trainguard.detectors.findings import Finding


def stage_paces(medians: Mapping[int, float], stage_of: Mapping[int, int]) -> dict[int, float]:
    """Each stage's typical time over the fastest stage's: ``stage -> pace`` (≥ 1), or ``{}``.

    A stage's typical time is the *lower* median of its ranks' times: one slow rank never
    makes its stage look slow while the stage has another replica (with two, the faster one
    counts: "all ranks slower"). Only ranks with a known stage count; fewer than two stages
    have no pace.

    >>> stage_paces({0: 1.0, 1: 1.0, 2: 1.6, 3: 1.7}, {0: 0, 1: 0, 2: 1, 3: 1})
    {0: 1.0, 1: 1.6}
    >>> stage_paces({0: 2.2, 1: 1.0, 2: 1.0, 3: 1.0}, {0: 0, 1: 0, 2: 1, 3: 1})  # one slow rank: not its stage
    {0: 1.0, 1: 1.0}
    >>> stage_paces({0: 1.0, 1: 2.0}, {0: 0, 1: 0})
    {}
    """
    per_stage: dict[int, list[float]] = {}
    for rank, seconds in medians.items():
        stage = stage_of.get(rank)
        if stage is not None:
            per_stage.setdefault(stage, []).append(seconds)
    if len(per_stage) < 2:
        return {}
    typical = {stage: median_low(times) for stage, times in sorted(per_stage.items())}
    fastest = min(typical.values())
    if fastest <= 0:
        return {}
    return {stage: t / fastest for stage, t in typical.items()}


class StageBalance:
    """Stage paces learnt over the first ``snapshots`` evaluations of a run, then frozen.

    ``imbalance_ratio``: a stage at least this much slower than the fastest stage in *every*
    learning snapshot is reported once as a pipeline imbalance (``severity="warning"``,
    layer ``application``, no rank or node blamed).
    """

    def __init__(self, snapshots: int = 5, imbalance_ratio: float = 1.25) -> None:
        self.snapshots = snapshots
        self.imbalance_ratio = imbalance_ratio
        self.frozen: dict[int, float] | None = None
        self._seen: list[dict[int, float]] = []
        self._first_ts: float | None = None

    def paces(self, medians: Mapping[int, float], stage_of: Mapping[int, int]) -> dict[int, float]:
        """The frozen paces once learnt; until then, those of the current medians."""
        return self.frozen if self.frozen is not None else stage_paces(medians, stage_of)

    def learn(self, ts: float, medians: Mapping[int, float], stage_of: Mapping[int, int]) -> Finding | None:
        """Take one evaluation's paces while learning; the imbalance finding when learning ends with one.

        A snapshot counts only when every stage placed so far has a rank with a full window.
        """
        if self.frozen is not None:
            return None
        paces = stage_paces(medians, stage_of)
        if not paces or set(paces) != set(stage_of.values()):
            return None
        if self._first_ts is None:
            self._first_ts = ts
        self._seen.append(paces)
        if len(self._seen) < self.snapshots:
            return None
        frozen = self.frozen = {stage: median(p[stage] for p in self._seen) for stage in paces}
        heavy = [s for s in frozen if all(p[s] >= self.imbalance_ratio for p in self._seen)]
        if not heavy:
            return None
        fastest = min(frozen, key=lambda s: frozen[s])
        evidence = []
        for stage in sorted(heavy, key=lambda s: -frozen[s]):
            ranks = sorted(r for r, s in stage_of.items() if s == stage)
            shown = ", ".join(map(str, ranks[:8])) + (", …" if len(ranks) > 8 else "")
            evidence.append(
                f"pipeline stage {stage} computes {frozen[stage]:.2f}× the fastest stage ({fastest}) on all "
                f"{len(ranks)} of its ranks ({shown}), from the start: stage partitioning, not a worker fault"
            )
        evidence.append("stage paces: " + ", ".join(f"{s}: {p:.2f}" for s, p in sorted(frozen.items())))
        return Finding(
            kind="imbalance",
            category="pipeline_imbalance",
            layer="application",
            onset_ts=self._first_ts,
            detected_at=ts,
            transient=False,
            confidence=0.8,
            evidence=evidence,
            severity="warning",
        )
