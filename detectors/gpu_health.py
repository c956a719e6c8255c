"""Per-node GPU health rules on NVML samples: Xid events, ECC, row remaps.

Counters are cumulative, so the rules look at increments between samples of the
same GPU, and a counter that goes *down* (driver reload) is a reset, not an
error.

>>> from detectors.events import GpuSample
>>> health = GpuHealth()
>>> health.observe(GpuSample(ts=10.0, node="n1", gpu=0, ecc_dbe_total=0))
[]
>>> [f.category for f in health.observe(GpuSample(ts=20.0, node="n1", gpu=0, ecc_dbe_total=2))]
['ecc_dbe']
>>> health.observe(GpuSample(ts=30.0, node="n1", gpu=0, ecc_dbe_total=0))  # reset after reload
[]
"""

from __future__ import annotations

from detectors.crash import Finding
from detectors.events import GpuSample
from detectors.signatures import XID_CLASSES


class GpuHealth:
    """Counter and event rules; each (GPU, category) fires at most once per ``cooldown_s``."""

    def __init__(self, cooldown_s: float = 3600.0) -> None:
        self.cooldown_s = cooldown_s
        self._last: dict[int, GpuSample] = {}
        self._fired: dict[tuple[int, str], float] = {}

    def observe(self, sample: GpuSample) -> list[Finding]:
        prev = self._last.get(sample.gpu)
        self._last[sample.gpu] = sample
        found: list[Finding] = []
        if sample.xid is not None:
            found += [f for f in xid_findings(sample) if self._cool(sample, f.category)]
        if prev is not None:
            dbe = _increase(prev.ecc_dbe_total, sample.ecc_dbe_total)
            if dbe:
                found += self._fire(sample, "ecc_dbe", "hardware", False, f"ECC double-bit errors +{dbe}")
        if sample.remapped_rows_pending:
            found += self._fire(
                sample, "row_remap_pending", "hardware", False, f"{sample.remapped_rows_pending} row remap(s) pending"
            )
        return found

    def _cool(self, s: GpuSample, category: str) -> bool:
        """True (and starts the cooldown) unless this GPU fired ``category`` recently."""
        ts = float(s.ts)
        last = self._fired.get((s.gpu, category))
        if last is not None and ts - last < self.cooldown_s:
            return False
        self._fired[(s.gpu, category)] = ts
        return True

    def _fire(self, s: GpuSample, category: str, layer: str, transient: bool | None, why: str) -> list[Finding]:
        if not self._cool(s, category):
            return []
        return [_gpu_finding(s, "gpu_degraded", category, layer, transient, why)]


def _gpu_finding(s: GpuSample, kind: str, category: str, layer: str, transient: bool | None, why: str) -> Finding:
    ts = float(s.ts)
    return Finding(
        kind=kind,
        category=category,
        layer=layer,
        onset_ts=ts,
        detected_at=ts,
        transient=transient,
        nodes=[s.node],
        gpus=[f"{s.node}/{s.gpu}"],
        confidence=0.9,
        evidence=[f"{s.node}/gpu{s.gpu}: {why}"],
    )


def _increase(before: int | None, after: int | None) -> int:
    """Increment of a cumulative counter; 0 across a reset or a missing value."""
    if before is None or after is None or after < before:
        return 0
    return after - before


def xid_findings(sample: GpuSample) -> list[Finding]:
    """A crash finding for an Xid event reported by NVML in a GPU sample."""
    if sample.xid is None:
        return []
    layer, transient, name = XID_CLASSES.get(sample.xid, ("hardware", None, "unlisted Xid"))
    finding = _gpu_finding(sample, "crash", f"xid_{sample.xid}", layer, transient, f"NVML Xid {sample.xid}: {name}")
    finding.signature = "nvml_xid"
    return [finding]
