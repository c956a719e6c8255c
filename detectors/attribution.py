"""First-pass attribution: the layer to blame and whether the fault is transient.

Signatures carry a layer and a transient hint; this fills the gaps by category
so every anomaly leaves with a layer and a transient verdict.

>>> attribute_layer("nccl_timeout", "system", None)
('system', True)
>>> attribute_layer("xid_79", "hardware", False)
('hardware', False)
"""

from __future__ import annotations

_CATEGORY_LAYER: dict[str, str] = {
    "process_crash": "application",
    "job_failed": "application",
    "cuda_error": "application",
    "no_progress": "unknown",
    "slow_job": "unknown",
    "slow_rank": "hardware",
    "slow_gpu": "hardware",
    "slow_nic": "hardware",
    "node_fail": "hardware",
    "node_down": "hardware",
}


def attribute_layer(category: str, layer: str, transient: bool | None) -> tuple[str, bool | None]:
    """``(layer, transient)`` for a finding, using its signature's hints first."""
    if layer == "unknown":
        layer = _CATEGORY_LAYER.get(category, "unknown")
    if transient is None:
        # One-off network and system errors are retried; hardware and
        # application faults repeat until someone acts.
        transient = {"system": True, "hardware": False, "application": False}.get(layer)
    return layer, transient
