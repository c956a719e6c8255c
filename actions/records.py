"""The action record: what the action sink decided or did about one anomaly (the output contract).

``Action`` lived in ``detectors.events`` up to 0.1; snapshots naming it there still restore
(``trainguard.dataflows.snapshots``).
"""

from __future__ import annotations

from typing import Literal

import msgspec

from trainguard.detectors.events import SCHEMA_VERSION

__all__ = ["Action", "ActionName", "Mode", "Status"]

# ``diagnose``: ask a job's nodes for its ranks' Python stacks (read-only: carried out in every mode).
ActionName = Literal[
    "drain_node", "resume_node", "requeue_job", "hold_job", "release_job", "cancel_job", "notify", "diagnose"
]
Mode = Literal["monitor", "enforce"]
Status = Literal["recommended", "applied", "failed", "suppressed", "rejected"]


class Action(msgspec.Struct, kw_only=True, gc=False):
    action_id: str
    anomaly_id: str
    decided_at: float
    action: ActionName
    target: str
    params: dict[str, str] = {}
    mode: Mode = "monitor"
    status: Status = "recommended"
    reason: str = ""
    applied_at: float | None = None
    schema_version: int = SCHEMA_VERSION
