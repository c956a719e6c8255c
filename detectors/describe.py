"""The words an anomaly carries for people: a one-line summary and the runbook to follow.

Filled in once the anomaly is final (after the history step may have revised its layer or
transience), so what a notification, the console and ``explain`` say matches the record.

>>> from trainguard.detectors.events import Anomaly
>>> a = Anomaly(anomaly_id="an-1", detected_at=0.0, kind="crash", category="xid_79", layer="hardware",
...             job_id="42", nodes=["gpu-node-07"], gpus=["gpu-node-07/3"])
>>> summary(a)
'crash/xid_79 (hardware) on gpu-node-07 (gpu-node-07/3), job 42'
>>> described(a, "https://runbooks.example/{kind}").runbook_url
'https://runbooks.example/crash'
"""

from __future__ import annotations

import msgspec

from trainguard.detectors.events import Anomaly

__all__ = ["described", "summary"]


def summary(anomaly: Anomaly) -> str:
    """One line: what, which layer, where (nodes, and GPUs when known), which job."""
    where = ", ".join(anomaly.nodes) or "no node"
    if anomaly.gpus:
        where += f" ({', '.join(anomaly.gpus)})"
    job = f", job {anomaly.job_id}" if anomaly.job_id else ""
    return f"{anomaly.kind}/{anomaly.category} ({anomaly.layer}) on {where}{job}"


def described(anomaly: Anomaly, runbook_url: str) -> Anomaly:
    """``anomaly`` with its ``summary`` and ``runbook_url`` (``{kind}``, ``{category}`` filled in)."""
    url = runbook_url.format(kind=anomaly.kind, category=anomaly.category)
    return msgspec.structs.replace(anomaly, summary=summary(anomaly), runbook_url=url)
