"""Deterministic identifiers, so a replay yields the same ids as the live run.

>>> anomaly_id("job/42", "crash", "xid_79", 1796205600.0)
'an-24565cea71fb740d'
"""

from __future__ import annotations

import hashlib


def _digest(*parts: object) -> str:
    text = "|".join("" if p is None else str(p) for p in parts)
    return hashlib.blake2b(text.encode(), digest_size=8).hexdigest()


def anomaly_id(scope: str, kind: str, category: str, onset_ts: float) -> str:
    """Id of the anomaly of ``kind``/``category`` in ``scope`` (a job or node key) starting at ``onset_ts``."""
    return "an-" + _digest(scope, kind, category, f"{onset_ts:.3f}")


def action_id(anomaly: str, action: str, target: str) -> str:
    """Idempotency key of one action on one target for one anomaly."""
    return "ac-" + _digest(anomaly, action, target)


def evidence_line(node: str | None, rank: int | None, text: str, limit: int = 300) -> str:
    """One evidence entry: where it was seen and the (clipped) text."""
    where = node or "?"
    if rank is not None:
        where += f"/rank{rank}"
    text = text.strip()
    if len(text) > limit:
        text = text[: limit - 1] + "…"
    return f"{where}: {text}"
