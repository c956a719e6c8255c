"""The circuit breaker on drains: a storm of anomalies must not empty a partition.

A drain is allowed only while fewer than ``max_drains_per_hour`` drains were
applied in the last hour and, after it, no partition of the node would have more
than ``max_partition_fraction`` of its nodes unavailable. When a check fails the
breaker is *open*: the drain becomes a recommendation, and the open/closed
transitions are reported so the audit log and the console can show them.

>>> from trainguard.actions.drivers import Inventory, NodeInfo
>>> inv = Inventory(nodes={f"n{i}": NodeInfo(f"n{i}", "idle", ("gpu",)) for i in range(10)})
>>> breaker = CircuitBreaker(max_partition_fraction=0.2, max_drains_per_hour=5)
>>> breaker.check("n1", inv, now=0.0) is None
True
>>> inv.nodes["n1"] = NodeInfo("n1", "idle", ("gpu",), drained=True); breaker.record_drain(0.0)
>>> inv.nodes["n2"] = NodeInfo("n2", "idle", ("gpu",), drained=True); breaker.record_drain(1.0)
>>> breaker.check("n3", inv, now=2.0)
'draining n3 would leave 3/10 nodes of partition gpu unavailable (limit 20%)'
"""

from __future__ import annotations

from collections import deque

from trainguard.actions.drivers import Inventory

HOUR_S = 3600.0


class CircuitBreaker:
    def __init__(self, max_partition_fraction: float, max_drains_per_hour: int) -> None:
        self.max_partition_fraction = max_partition_fraction
        self.max_drains_per_hour = max_drains_per_hour
        self._drains: deque[float] = deque()
        self.open_reason: str | None = None

    @property
    def is_open(self) -> bool:
        return self.open_reason is not None

    def record_drain(self, at: float) -> None:
        self._drains.append(at)

    def check(self, node: str, inventory: Inventory, now: float) -> str | None:
        """Why draining ``node`` now would trip the breaker, or ``None`` when it may go ahead."""
        while self._drains and self._drains[0] <= now - HOUR_S:
            self._drains.popleft()
        if len(self._drains) >= self.max_drains_per_hour:
            return f"{len(self._drains)} drains in the last hour (limit {self.max_drains_per_hour})"
        info = inventory.nodes.get(node)
        for partition in info.partitions if info else ():
            members = inventory.partition_nodes(partition)
            down = sum(1 for n in members if n.unavailable or n.name == node)
            if down > self.max_partition_fraction * len(members):
                return (
                    f"draining {node} would leave {down}/{len(members)} nodes of partition {partition} "
                    f"unavailable (limit {self.max_partition_fraction:.0%})"
                )
        return None

    def update(self, reason: str | None) -> bool:
        """Set the state from the latest check; ``True`` when it changed (open ↔ closed)."""
        changed = (reason is None) != (self.open_reason is None)
        self.open_reason = reason
        return changed
