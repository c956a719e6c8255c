"""The anomaly lifecycle: open, then resolved, under one id.

An anomaly is published when it opens and again when it resolves; a reader of the
stream (the archive, the console, the scorer) keeps one record per id, the
resolution when there is one.

>>> rows = [{"anomaly_id": "a", "resolved_at": None, "kind": "hang"},
...         {"anomaly_id": "b", "resolved_at": None, "kind": "crash"},
...         {"anomaly_id": "a", "resolved_at": 70.0, "kind": "hang", "resolution": "progress resumed after 42 s"}]
>>> [(r["anomaly_id"], r["resolved_at"]) for r in latest_records(rows)]
[('a', 70.0), ('b', None)]
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

# Resolutions, as their text begins: a hang that progress ends was a false alarm.
PROGRESS_RESUMED = "progress resumed"
JOB_ENDED = "job ended"
JOB_RESTARTED = "job restarted"
NODE_RETURNED = "node returned to service"
SUPERSEDED = "explained by"


def latest_records(rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """One record per ``anomaly_id``: the resolved one if any, else the latest (an open anomaly published
    again is a revision: its stacks named the culprit); in first-seen order.

    >>> rows = [{"anomaly_id": "a", "resolved_at": None, "ranks": []},
    ...         {"anomaly_id": "a", "resolved_at": None, "ranks": [2], "revised_at": 90.0}]
    >>> [r["ranks"] for r in latest_records(rows)]
    [[2]]
    """
    out: dict[str, dict[str, Any]] = {}
    for row in rows:
        key = row["anomaly_id"]
        if key not in out or out[key].get("resolved_at") is None:
            out[key] = row
    return list(out.values())


def is_false_alarm(kind: str | None, resolution: str | None) -> bool:
    """A hang that ended because the job went on by itself: it was never hung.

    >>> is_false_alarm("hang", "progress resumed after 90 s"), is_false_alarm("hang", "job ended (FAILED)")
    (True, False)
    """
    return kind == "hang" and (resolution or "").startswith(PROGRESS_RESUMED)
