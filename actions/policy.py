"""From anomaly to recommended actions (monitor mode).

The rules follow operators' practice: blame hardware → drain the suspect nodes
and requeue the job without them; a transient system fault → requeue; an
application fault → hold the job and notify, never drain; everything else →
notify. In monitor mode every action is published as a recommendation.

>>> from detectors.events import Anomaly
>>> a = Anomaly(anomaly_id="an-1", detected_at=10.0, kind="crash", category="xid_79",
...             layer="hardware", transient=False, job_id="42", nodes=["n3"])
>>> [(x.action, x.target, x.status) for x in decide(a)]
[('drain_node', 'n3', 'recommended'), ('requeue_job', '42', 'recommended')]
"""

from __future__ import annotations

from detectors.events import Action, Anomaly
from detectors.ids import action_id


def _action(anomaly: Anomaly, kind: str, target: str, reason: str, **params: str) -> Action:
    return Action(
        action_id=action_id(anomaly.anomaly_id, kind, target),
        anomaly_id=anomaly.anomaly_id,
        decided_at=anomaly.detected_at,
        action=kind,
        target=target,
        params=params,
        mode="monitor",
        status="recommended",
        reason=reason,
    )


def decide(anomaly: Anomaly) -> list[Action]:
    """The actions this anomaly calls for, as recommendations."""
    why = f"{anomaly.kind}/{anomaly.category} ({anomaly.anomaly_id})"
    job = anomaly.job_id
    out: list[Action] = []
    if anomaly.layer == "hardware" and anomaly.nodes and anomaly.kind != "straggler":
        for node in anomaly.nodes:
            out.append(_action(anomaly, "drain_node", node, f"trainguard: {why}"))
        if job is not None and anomaly.kind in ("crash", "hang", "gpu_degraded"):
            out.append(_action(anomaly, "requeue_job", job, why, exclude=",".join(anomaly.nodes)))
    elif job is not None and anomaly.kind in ("crash", "hang") and anomaly.layer == "application":
        out.append(_action(anomaly, "hold_job", job, why))
        out.append(_action(anomaly, "notify", job, why))
    elif job is not None and anomaly.kind in ("crash", "hang") and (anomaly.transient or anomaly.kind == "hang"):
        out.append(_action(anomaly, "requeue_job", job, why))
    else:
        out.append(_action(anomaly, "notify", job or ",".join(anomaly.nodes) or "cluster", why))
    return out
