"""A node's GPU records of one poll sent as one sweep record (the ``gpu`` topic's ``gpu_sweep`` form).

>>> rows = [("gpu", {"ts": 1.0, "node": "n1", "gpu": g, "util_pct": 90.0 + g, "xid": None}) for g in range(2)]
>>> sweeps = as_sweeps([*rows, ("logs", {"ts": 1.0, "node": "n1", "line": "GPU is lost"})])
>>> sweeps[0]
('gpu', {'ts': 1.0, 'node': 'n1', 'gpus': [0, 1], 'util_pct': [90.0, 91.0]})
>>> sweeps[1][0]
'logs'
"""

from __future__ import annotations

import threading
from typing import Any

from trainguard.agents.loop import Agent, Publish


def as_sweeps(records: list[Publish]) -> list[Publish]:
    """``gpu`` records grouped by node and timestamp into sweeps (fields no GPU reported are left out);
    other records as they were, after the sweeps."""
    groups: dict[tuple[str, Any], list[dict[str, Any]]] = {}
    others: list[Publish] = []
    for stream, record in records:
        if stream == "gpu" and "gpu" in record:
            groups.setdefault((record["node"], record["ts"]), []).append(record)
        else:
            others.append((stream, record))
    sweeps: list[Publish] = []
    for (node, ts), rows in groups.items():
        names = [k for k in rows[0] if k not in ("ts", "node", "gpu")]
        names += [k for row in rows[1:] for k in row if k not in names and k not in ("ts", "node", "gpu")]
        columns = {k: [row.get(k) for row in rows] for k in names}
        sweep = {"ts": ts, "node": node, "gpus": [row["gpu"] for row in rows]}
        sweep |= {k: v for k, v in columns.items() if any(x is not None for x in v)}
        sweeps.append(("gpu", sweep))
    return sweeps + others


class Sweeps(Agent):
    """Another agent's GPU records, a node's sweep in one record."""

    def __init__(self, agent: Agent) -> None:
        self.agent = agent
        self.name = agent.name

    def poll(self) -> list[Publish]:
        return as_sweeps(self.agent.poll())

    def wait(self, seconds: float, stop: threading.Event) -> list[Publish]:
        return as_sweeps(self.agent.wait(seconds, stop))

    def problems(self) -> list[str]:
        return self.agent.problems()

    def commit(self) -> None:
        self.agent.commit()

    def close(self) -> None:
        self.agent.close()

    def key(self, stream: str, record: dict[str, Any]) -> str | None:
        return self.agent.key(stream, record)
