"""What a detector claims, before the job monitor turns it into an :class:`~detectors.events.Anomaly`.

Every detector (crash, hang, straggler, GPU health, rank scores) speaks this one
type, so grouping, localisation and attribution treat their claims alike.

``severity``: ``critical`` findings are acted on by the policy; ``warning`` and
``info`` findings are only ever notified (a novelty score, an Xid NVIDIA says to
ignore, a pipeline imbalance). ``remedy``: what the node needs when the finding
knows (NVIDIA's vocabulary: ``RESET_GPU``, ``RESTART_BM``, ``CONTACT_SUPPORT`` …).
"""

from __future__ import annotations

from dataclasses import dataclass, field

SEVERITIES = ("info", "warning", "critical")


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
