"""What a detector claims, before the job monitor turns it into an :class:`~detectors.events.Anomaly`.

Every detector (crash, hang, straggler, GPU health, rank scores) speaks this one
type, so grouping, localisation and attribution treat their claims alike.

``severity``: ``critical`` findings are acted on by the policy; ``warning`` and
``info`` findings are only ever notified (a novelty score, an Xid NVIDIA says to
ignore, a pipeline imbalance). ``remedy``: what the node needs when the finding
knows (NVIDIA's vocabulary: ``RESET_GPU``, ``RESTART_BM``, ``CONTACT_SUPPORT`` …).
"""

from __future__ import annotations

from collections import deque
from dataclasses import MISSING, dataclass, field, fields
from typing import Any

SEVERITIES = ("info", "warning", "critical")


def count_recent(times: deque[float], ts: float, window_s: float) -> int:
    """Add ``ts`` to ``times`` and return how many fall within the last ``window_s`` (a burst's size).

    >>> times: deque[float] = deque()
    >>> [count_recent(times, t, 60.0) for t in (0.0, 30.0, 50.0, 100.0)]
    [1, 2, 3, 2]
    """
    times.append(ts)
    while times and times[0] < ts - window_s:
        times.popleft()
    return len(times)


@dataclass(slots=True)
class Finding:
    """A detector's claim before incident grouping turns it into an anomaly."""

    kind: str
    category: str
    layer: str
    onset_ts: float
    detected_at: float
    transient: bool | None = None
    nodes: list[str] = field(default_factory=list)
    ranks: list[int] = field(default_factory=list)
    gpus: list[str] = field(default_factory=list)
    confidence: float = 0.5
    evidence: list[str] = field(default_factory=list)
    cascade: bool = False
    signature: str = ""
    severity: str = "critical"
    remedy: str | None = None
    # How the culprit was named, when it was ("heartbeats", "progress", "stacks", "gpu"): a reader
    # weighs "rank 2 stopped beating" differently from "rank 2's last step was older".
    localisation: str | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def __setstate__(self, state: Any) -> None:
        # Snapshots of earlier versions pickled findings as (None, {slot: value}) and lack the
        # fields added since: those take their defaults.
        if isinstance(state, tuple) and len(state) == 2 and state[0] is None:
            state = state[1]
        if isinstance(state, list):
            state = {f.name: value for f, value in zip(fields(self), state, strict=False)}
        for f in fields(self):
            if f.name in state:
                value = state[f.name]
            elif f.default is not MISSING:
                value = f.default
            else:
                value = f.default_factory()  # type: ignore[misc]
            object.__setattr__(self, f.name, value)
