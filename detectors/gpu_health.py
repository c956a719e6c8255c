"""GPU health rules on NVML samples: Xid events, ECC, row remaps, link error bursts, throttling, lost GPUs.

Counters are cumulative, so the rules look at increments between samples of the
same GPU within a window, and a counter that goes *down* (driver reload) is a
reset, not an error. Each (GPU, category) fires at most once per cooldown.

>>> from trainguard.detectors.events import GpuSample
>>> health = GpuHealth()
>>> health.observe(GpuSample(ts=10.0, node="n1", gpu=0, ecc_dbe_total=0))
[]
>>> [f.category for f in health.observe(GpuSample(ts=20.0, node="n1", gpu=0, ecc_dbe_total=2))]
['ecc_dbe']
>>> health.observe(GpuSample(ts=30.0, node="n1", gpu=0, ecc_dbe_total=0))  # reset after reload
[]
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

import msgspec
import numpy as np

from trainguard.detectors.drift import DriftDetector
from trainguard.detectors.events import Event, GpuSample
from trainguard.detectors.findings import Finding, count_recent
from trainguard.detectors.frames import (
    COLUMN,
    COUNTERS,
    SLOWDOWN_REASONS,
    UTIL,
    GpuFrame,
    as_frame,
    nulls,
    throttle_mask,
)
from trainguard.detectors.ids import gpu_id
from trainguard.detectors.xid import xid_info


class GpuHealthSettings(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    cooldown_s: float = 3600.0
    burst_window_s: float = 600.0
    # Corrected errors are normal in small numbers; a burst means a part is going.
    sbe_burst: int = 100
    pcie_replay_burst: int = 100
    nvlink_crc_burst: int = 100
    throttle_samples: int = 3  # consecutive samples slowed by heat or power brake
    missing_after_s: float = 60.0  # a GPU silent this long while its node reports is lost
    # Online novelty score (detectors.drift) of an idle GPU's temperature and power:
    # an idle GPU should sit still, so a new excursion is a part going bad.
    drift_threshold: float = 0.9
    drift_idle_util_pct: float = 5.0
    # An Xid NVIDIA says to ignore (43, 63, 92 …) this many times within an hour on one GPU is worth a warning.
    ignored_xid_burst: int = 3


_BURSTS = (
    ("ecc_sbe_total", "ecc_sbe_burst", "sbe_burst", "corrected ECC errors"),
    ("pcie_replay_total", "pcie_replay_burst", "pcie_replay_burst", "PCIe replays"),
    ("nvlink_crc_total", "nvlink_crc_burst", "nvlink_crc_burst", "NVLink CRC errors"),
)
_THROTTLES = (
    (0x80, "power_brake", "HW power brake"),
    (0x60, "thermal_throttle", "thermal slowdown"),
    (0x8, "hw_slowdown", "HW slowdown"),
)


_QUIET, _DRIFT, _JUDGE = range(3)  # what a GPU's sample needs (see GpuHealth._need)
_TEMP, _POWER = COLUMN["temp_c"], COLUMN["power_w"]
_DBE, _PENDING, _FAILED, _XID, _THROTTLE, _UTIL_ROW = (
    COLUMN[f]
    for f in ("ecc_dbe_total", "remapped_rows_pending", "remapped_rows_failed", "xid", "throttle_reasons", "util_pct")
)
_BURST_ROWS = tuple(COLUMN[field] for field, *_ in _BURSTS)
_BURSTS_BY_ROW = tuple(zip(_BURST_ROWS, _BURSTS, strict=True))
_JUDGED = max(_DBE, _PENDING, _FAILED, _XID, _THROTTLE, _UTIL_ROW, *_BURST_ROWS) + 1  # the rows judging reads


def _int(value: float) -> int | None:
    """A counter's value as its record has it: NaN is null."""
    return int(value) if value == value else None


def _moved(before: GpuFrame, frame: GpuFrame) -> list[bool]:
    """Per GPU of two frames of the same GPUs: whether any counter differs, bit for bit."""
    then, now = before.values[:COUNTERS], frame.values[:COUNTERS]
    return (then.view(np.int64) != now.view(np.int64)).any(axis=0).tolist()


class GpuHealth:
    """Counter, event and throttle rules over the samples of any number of GPUs."""

    def __init__(self, settings: GpuHealthSettings | None = None, idle_drift: bool = True) -> None:
        """``idle_drift``: score idle GPUs' temperature and power for novelty (nodes with no job only:
        a job's GPUs idle for its own reasons — a checkpoint, the end of the job)."""
        self.settings = settings or GpuHealthSettings()
        self.idle_drift = idle_drift
        # Each GPU's last sample is in its node's last frame, or — for a GPU that frame lacks — in _last.
        self._frames: dict[str, GpuFrame] = {}
        self._last: dict[tuple[str, int], tuple[GpuFrame, int]] = {}
        self._counters: dict[tuple[str, int, str], list[tuple[float, int]]] = {}
        self._throttled: dict[tuple[str, int], int] = {}  # consecutive slowed samples, GPUs with some only
        self._fired: dict[tuple[str, int, str], float] = {}
        self._xid_bursts: dict[tuple[str, int, str], deque[float]] = {}  # ignored Xids seen, per GPU
        self._drift: dict[tuple[str, int, str], DriftDetector] = {}

    def observe(self, event: Event | GpuFrame) -> list[Finding]:
        """A GPU sample or a node's frame (other events are not this detector's): Xids, counter bursts,
        throttling, drift.

        A frame with nothing rare in it (no Xid, remap or slowdown) whose counters equal the node's
        previous frame, on a node none of whose GPUs is being counted as throttled, is judged as a
        whole — nothing to say; any other is judged GPU by GPU.
        """
        if type(event) is not GpuFrame and not isinstance(event, GpuSample):
            return []
        frame = as_frame(event)  # type: ignore[arg-type]
        node = frame.node
        before = self._frames.get(node)
        self._frames[node] = frame
        if (
            before is not None
            and not frame.rare
            and before.gpus == frame.gpus
            and self._throttled.keys().isdisjoint(frame.keys)
            and before.counter_key() == frame.counter_key()
            and not (self.idle_drift and self._any_idle(frame))
        ):
            return []
        found: list[Finding] = []
        if before is not None and before.gpus != frame.gpus:
            for i, key in enumerate(before.keys):  # GPUs this frame lacks keep their last sample here
                if key[1] not in frame.gpus:
                    self._last[key] = (before, i)
        rare = frame.rare_gpus() if frame.rare else None  # which GPUs carry the news
        if before is not None and before.gpus == frame.gpus:
            return self._same_gpus(before, frame, rare)
        for i, key in enumerate(frame.keys):
            if before is not None and key[1] in before.gpus:
                last: tuple[GpuFrame, int] | None = (before, before.gpus.index(key[1]))
            else:
                last = self._last.pop(key, None)
            need = _JUDGE if last is None or (rare and rare[i]) else self._need(frame, i, last, key)
            if need == _DRIFT:
                found += self._drift_of_gpu(frame, i)
            elif need == _JUDGE:
                found += self._judge(frame, i, last)
        return found

    def _same_gpus(self, before: GpuFrame, frame: GpuFrame, rare: list[bool] | None) -> list[Finding]:
        """A frame of the same GPUs as the node's last one, which did not pass as a whole. A GPU whose
        counters moved (bit for bit, as the bytes compared), whose sample is rare or that is being counted
        as throttled is judged; an idle one, of a node with no job, has its drift scored; the rest: nothing."""
        moved, throttled = _moved(before, frame), self._throttled
        idle = (frame.values[UTIL] < self.settings.drift_idle_util_pct).tolist() if self.idle_drift else None
        found: list[Finding] = []
        for i, key in enumerate(frame.keys):
            if moved[i] or (rare and rare[i]) or key in throttled:
                found += self._judge(frame, i, (before, i))
            elif idle and idle[i]:
                found += self._drift_of_gpu(frame, i)
        return found

    def _drift_of_gpu(self, frame: GpuFrame, i: int) -> list[Finding]:
        values = frame.values  # (item(row, column): a Python float without a numpy scalar on the way)
        temp, power = nulls([values.item(_TEMP, i), values.item(_POWER, i)])
        return self._drift_of_idle(frame.keys[i], temp, power, lambda: frame.sample(i))

    def _need(self, frame: GpuFrame, i: int, last: tuple[GpuFrame, int], key: tuple[str, int]) -> int:
        """What GPU ``i`` of a frame, its sample not rare, needs: nothing (counters as they were, not being
        counted as throttled), its idle drift scored (an idle GPU of a node with no job), or judging."""
        before, j = last
        if key in self._throttled or before.values[:COUNTERS, j].tobytes() != frame.values[:COUNTERS, i].tobytes():
            return _JUDGE
        return self._idle_need(frame, i)

    def _idle_need(self, frame: GpuFrame, i: int) -> int:
        return _DRIFT if self.idle_drift and frame.values.item(UTIL, i) < self.settings.drift_idle_util_pct else _QUIET

    def _any_idle(self, frame: GpuFrame) -> bool:
        util = frame.values[UTIL]
        return bool((util < self.settings.drift_idle_util_pct).any())

    def _judge(self, frame: GpuFrame, i: int, last: tuple[GpuFrame, int] | None) -> list[Finding]:
        """GPU ``i`` of a frame against its previous sample (``last``: a frame and the GPU's column there). Read
        from the columns as its record would have them (NaN is null, counters are integers); the record is
        made for a finding."""
        s = self.settings
        key = frame.keys[i]
        now = frame.values[:_JUDGED, i].tolist()
        found: list[Finding] = []
        if now[_XID] == now[_XID]:  # (not NaN: an Xid was reported)
            sample = frame.sample(i)
            found += [f for f in xid_findings(sample) if self._xid_counts(sample, f) and self._cool(sample, f.category)]
        prev = None if last is None else last[0].values[:_JUDGED, last[1]].tolist()
        if prev is not None:
            dbe = _increase(_int(prev[_DBE]), _int(now[_DBE]))
            if dbe:
                found += self._fire(frame.sample(i), "ecc_dbe", False, f"ECC double-bit errors +{dbe}")
        if _int(now[_FAILED]):
            found += self._fire(
                frame.sample(i), "row_remap_failure", False, "row remapping failed: the GPU needs replacing"
            )
        pending = _int(now[_PENDING])
        if pending:
            found += self._fire(frame.sample(i), "row_remap_pending", False, f"{pending} row remap(s) pending")
        counters_moved = prev is None or any(_int(prev[row]) != _int(now[row]) for row in _BURST_ROWS)
        for row, (field, category, limit_name, what) in _BURSTS_BY_ROW if counters_moved else ():
            rise, since = self._window_rise(key, frame.ts, field, _int(now[row]))
            limit: int = getattr(s, limit_name)
            if rise >= limit:
                why = f"{what} +{rise} in {s.burst_window_s:g}s (limit {limit})"
                burst = self._fire(frame.sample(i), category, None, why)
                for f in burst:
                    f.onset_ts = since
                found += burst
        util = now[_UTIL_ROW]
        if self.idle_drift and util == util and util < s.drift_idle_util_pct:  # (NaN: not reported)
            found += self._drift_of_gpu(frame, i)
        mask = throttle_mask(_int(now[_THROTTLE]))
        if mask & SLOWDOWN_REASONS:
            slowed = self._throttled[key] = self._throttled.get(key, 0) + 1
        else:
            slowed = 0
            self._throttled.pop(key, None)
        if slowed >= s.throttle_samples:
            for bits, category, what in _THROTTLES:
                if mask & bits:
                    idle = (util if util == util else 0) < 5
                    why = f"{what} for {slowed} samples{' while idle' * idle}"
                    for f in self._fire(frame.sample(i), category, None, why):
                        # Under load it slows the job: a straggler's cause, notified like one. Idle, a GPU
                        # has no reason to be hot: its cooling is failing — drain before a job lands there.
                        f.severity = "critical" if idle else "warning"
                        found.append(f)
                    break
        return found

    def _drift_of_idle(
        self, key: tuple[str, int], temp: float | None, power: float | None, sample: Callable[[], GpuSample]
    ) -> list[Finding]:
        """An idle GPU's temperature and power scored for novelty (``sample``: its record, made if it fires)."""
        found: list[Finding] = []
        for field, value in (("temp_c", temp), ("power_w", power)):
            if value is None:
                continue
            detector = self._drift.get((*key, field))
            if detector is None:
                detector = self._drift[(*key, field)] = DriftDetector()
            score = detector.score_one(float(value))
            if score >= self.settings.drift_threshold:
                # A score alone may warn (watch the node), never drain it: a drain needs a hard signal.
                for f in self._fire(
                    sample(),
                    f"idle_{field.split('_')[0]}_drift",
                    None,
                    f"idle {field} {value:g} is novel for this GPU (score {score:.2f})",
                ):
                    f.severity = "warning"
                    found.append(f)
        return found

    def _xid_counts(self, sample: GpuSample, finding: Finding) -> bool:
        """Whether an Xid finding stands: always, unless NVIDIA says to ignore the code alone —
        then only a burst (``ignored_xid_burst`` within an hour on one GPU) is worth a warning."""
        if finding.severity == "critical":
            return True
        times = self._xid_bursts.setdefault((sample.node, sample.gpu, finding.category), deque())
        if count_recent(times, float(sample.ts), 3600.0) < self.settings.ignored_xid_burst:  # type: ignore[arg-type]
            return False
        finding.evidence.append(f"{len(times)} times within 1h on this GPU")
        times.clear()
        return True

    def __setstate__(self, state: dict[str, object]) -> None:
        state.setdefault("idle_drift", True)
        state.setdefault("_xid_bursts", {})
        if "_frames" not in state:  # written before frames: each GPU's last sample, a frame of one
            last: dict = state["_last"]  # type: ignore[assignment]
            state["_last"] = {key: (GpuFrame.from_samples([s]), 0) for key, s in last.items()}
            state["_frames"] = {}
            state["_throttled"] = {k: n for k, n in state["_throttled"].items() if n}  # type: ignore[attr-defined]
        self.__dict__.update(state)

    def advance(self, watermark: float) -> list[Finding]:
        """Nothing here waits on the clock (lost GPUs need the peers' view: see :meth:`lost`)."""
        return []

    def forget_samples(self) -> None:
        """Drop sample history (the GPUs were away, e.g. running a job); keep the cooldowns."""
        self._frames.clear()
        self._last.clear()
        self._counters.clear()
        self._throttled.clear()
        self._xid_bursts.clear()

    def lost(self, missing: list[tuple[str, int, float | None]], now: float) -> list[Finding]:
        """Findings for GPUs that stopped reporting: ``(node, gpu, last seen or None)`` (see :class:`GpuPeers`)."""
        found = []
        for node, gpu, last_seen in missing:
            ghost = GpuSample(ts=now, node=node, gpu=gpu)
            if not self._cool(ghost, "gpu_lost"):
                continue
            if last_seen is None:
                why = "never reported while higher-numbered GPUs of the node do"
            else:
                why = "stopped reporting while the node's other GPUs still do (fallen off the bus?)"
            f = _gpu_finding(ghost, "crash", "gpu_lost", "hardware", False, why)
            f.onset_ts = last_seen if last_seen is not None else now
            found.append(f)
        return found

    def _window_rise(self, gpu: tuple[str, int], ts: float, field: str, value: int | None) -> tuple[int, float]:
        """Rise of a GPU's cumulative counter within the burst window, and when the climb began.

        Only changes are stored (most samples repeat the last value), with one anchor
        at or before the window's start holding the value the window began with.
        """
        if value is None:
            return 0, 0.0
        key = (*gpu, field)
        history = self._counters.get(key)
        if history is None:
            history = self._counters[key] = []  # a list: most hold one anchor, and a deque weighs 600 bytes
        elif value == history[-1][1]:
            return 0, 0.0  # unchanged: no new rise to report
        elif value < history[-1][1]:
            history.clear()  # counter reset (driver reload): start over
        ts = float(ts)
        history.append((ts, value))
        start = ts - self.settings.burst_window_s
        while len(history) > 1 and history[1][0] <= start:
            del history[0]
        if len(history) == 1:
            return 0, ts
        rise = value - history[0][1]
        # The climb began where the latest run of closely spaced changes began: a stray corrected
        # error minutes earlier in the window is not its start. A climb spread over the whole
        # window (no run holding half of it) began at its first change.
        gap = self.settings.burst_window_s / 10
        i = len(history) - 1
        while i > 1 and history[i][0] - history[i - 1][0] <= gap:
            i -= 1
        run_rise = value - history[i - 1][1]
        return rise, history[i][0] if 2 * run_rise >= rise else history[1][0]

    def _cool(self, s: GpuSample, category: str) -> bool:
        """True (and starts the cooldown) unless this GPU fired ``category`` recently."""
        ts = float(s.ts)
        key = (s.node, s.gpu, category)
        last = self._fired.get(key)
        if last is not None and ts - last < self.settings.cooldown_s:
            return False
        self._fired[key] = ts
        return True

    def _fire(self, s: GpuSample, category: str, transient: bool | None, why: str) -> list[Finding]:
        if not self._cool(s, category):
            return []
        return [_gpu_finding(s, "gpu_degraded", category, "hardware", transient, why)]


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
        gpus=[gpu_id(s.node, s.gpu)],
        confidence=0.9,
        evidence=[f"{s.node}/gpu{s.gpu}: {why}"],
    )


def _increase(before: int | None, after: int | None) -> int:
    """Increment of a cumulative counter; 0 across a reset or a missing value."""
    if before is None or after is None or after < before:
        return 0
    return after - before


def xid_findings(sample: GpuSample) -> list[Finding]:
    """A finding for an Xid event reported by NVML in a GPU sample, judged by NVIDIA's catalog.

    An Xid NVIDIA says to ignore on its own (63: a row remap recorded, 43: a channel reset)
    is a warning: notified, never acted on.
    """
    if sample.xid is None:
        return []
    info = xid_info(sample.xid)
    kind = "gpu_degraded" if info.evidence_only else "crash"
    why = f"NVML Xid {sample.xid}: {info.description} (NVIDIA: {info.immediate})"
    finding = _gpu_finding(sample, kind, f"xid_{sample.xid}", info.layer, info.transient, why)
    finding.signature = "nvml_xid"
    finding.remedy = info.remedy
    finding.cascade = info.cascade
    if info.evidence_only:
        finding.severity = "warning"
    return [finding]
