"""Peer comparison of one job's GPUs: the odd one out, Minder-style.

GPUs of a synchronous job do the same work, so they should look alike. A slow
GPU shows a lower SM clock, a higher temperature, lower power or a thermal /
power-brake throttle reason; during a hang the healthy GPUs spin in NCCL
kernels (utilisation near 100 %) while the culprit sits idle or has vanished.
Each metric is compared with robust z-scores (median and MAD across the job's
GPUs) over the last few samples.

>>> from trainguard.detectors.events import GpuSample
>>> peers = GpuPeers()
>>> for t in range(3):
...     for g in range(8):
...         slow = g == 5
...         peers.observe(GpuSample(ts=10.0 * t, node="n1", gpu=g, util_pct=99.0, temp_c=88.0 if slow else 65.0,
...                                 power_w=420.0 if slow else 560.0, sm_clock_mhz=1410.0 if slow else 1980.0,
...                                 throttle_reasons=0x20 if slow else 0))
>>> peers.odd_one_out()
[('n1', 5)]
"""

from __future__ import annotations

from collections import deque
from statistics import median

from trainguard.detectors.events import GpuSample
from trainguard.detectors.frames import COLUMN, SLOWDOWN_REASONS, GpuFrame, as_frame, throttle_mask
from trainguard.detectors.gpu_activity import IDLE_UTIL, SPIN_UTIL
from trainguard.detectors.gpu_windows import GpuKey, GpuWindows

__all__ = ["SLOWDOWN_REASONS", "GpuPeers", "throttle_mask"]

Sighting = tuple[GpuFrame, int]  # a GPU's sample: the frame it came in and its column there
_THROTTLE = COLUMN["throttle_reasons"]


def _robust_z(values: dict[GpuKey, float]) -> dict[GpuKey, float]:
    if len(values) < 3:
        return {}
    mid = median(values.values())
    mad = median(abs(v - mid) for v in values.values())
    scale = max(mad * 1.4826, abs(mid) * 0.02, 1e-9)  # 2 % of the level: ignore jitter on identical GPUs
    return {k: (v - mid) / scale for k, v in values.items()}


class GpuPeers:
    """Recent samples of one job's GPUs, and the questions asked of them."""

    def __init__(self, history: int = 6, z_threshold: float = 4.0) -> None:
        self.history = history
        self.z_threshold = z_threshold
        self._samples: GpuWindows[Sighting] = GpuWindows(history, _sighting)
        self._first_seen: dict[str, float] = {}
        self.last_ts = 0.0

    def __setstate__(self, state: dict[str, object]) -> None:
        windows = state["_samples"]
        if type(windows) is dict:  # a snapshot written before node windows: each GPU's samples, kept as they are
            for key, window in windows.items():
                if window and type(window[0]) is GpuSample:  # (before frames: records, as frames of one)
                    windows[key] = deque(((GpuFrame.from_samples([s]), 0) for s in window), maxlen=window.maxlen)
            state["_samples"] = GpuWindows.of_gpus(int(state["history"]), _sighting, windows)  # type: ignore[call-overload]
        self.__dict__.update(state)

    def observe(self, sample: GpuSample | GpuFrame) -> None:
        """A sample, or a node's frame of samples."""
        frame = as_frame(sample)
        self._samples.append(frame)
        ts = frame.ts
        self._first_seen.setdefault(frame.node, ts)
        if ts > self.last_ts:
            self.last_ts = ts

    def _recent(self, field: str, last: int | None = None) -> dict[GpuKey, float]:
        row = COLUMN[field]
        out = {}
        for key, sightings in self._samples.items(last):
            values = [v for frame, i in sightings if (v := frame.values.item(row, i)) == v]
            if values:
                out[key] = median(values)
        return out

    def odd_one_out(self, last: int = 2) -> list[GpuKey]:
        """GPUs slower than their peers by clock, heat, power or a slowdown throttle, over the ``last`` samples.

        Few samples on purpose: a straggler is reported within seconds of its onset,
        while GPU samples come every ten.
        """
        suspicion: dict[GpuKey, float] = {}
        for field, sign in (("sm_clock_mhz", -1.0), ("temp_c", 1.0), ("power_w", -1.0)):
            for key, z in _robust_z(self._recent(field, last)).items():
                if sign * z > self.z_threshold:
                    suspicion[key] = suspicion.get(key, 0.0) + sign * z
        for key, window in self._samples.items(last):
            if any(_slowed(frame, i) for frame, i in window):
                suspicion[key] = suspicion.get(key, 0.0) + self.z_threshold
        if not suspicion or len(suspicion) * 4 > max(len(self._samples), 1):
            return []  # a quarter of the job "odd" is a job-wide change, not one GPU
        return sorted(suspicion, key=lambda k: -suspicion[k])[:2]

    def idle_while_peers_spin(self) -> list[GpuKey]:
        """During a hang: GPUs at ~0 % utilisation while most peers sit at ~100 % in NCCL kernels."""
        util = self._recent("util_pct")
        if len(util) < 3 or median(util.values()) < SPIN_UTIL:
            return []
        return sorted(k for k, u in util.items() if u < IDLE_UTIL)

    def missing(self, now: float, after_s: float) -> list[tuple[str, int, float | None]]:
        """``(node, gpu, last seen)`` of GPUs gone quiet while their node's other GPUs report (fell off
        the bus), and ``(node, gpu, None)`` for indexes never seen below ones that are — once the node
        has been reporting for ``after_s`` (samples of one round arrive in any order)."""
        last_by_node: dict[str, float] = {}
        seen: dict[str, set[int]] = {}
        for frame in self._samples.newest_frames():  # (a node whose GPUs were all seen last together lost none)
            last_by_node[frame.node] = frame.ts
            seen[frame.node] = set(frame.gpus)
        last_seen: dict[GpuKey, float] = {}
        for (node, gpu), (frame, _) in self._samples.newest_apart():
            last = last_seen[node, gpu] = frame.ts
            last_by_node[node] = max(last_by_node.get(node, 0.0), last)
            seen.setdefault(node, set()).add(gpu)
        out: list[tuple[str, int, float | None]] = []
        for (node, gpu), last in sorted(last_seen.items()):
            if now - last > after_s and last_by_node[node] > last + after_s / 2:
                out.append((node, gpu, last))
        for node, gpus in sorted(seen.items()):
            if now - self._first_seen.get(node, now) >= after_s:
                out += [(node, g, None) for g in range(max(gpus)) if g not in gpus]
        return out


def _sighting(frame: GpuFrame, i: int) -> Sighting:
    return frame, i


def _slowed(frame: GpuFrame, i: int) -> bool:
    reasons = frame.values.item(_THROTTLE, i)
    return reasons == reasons and int(reasons) & SLOWDOWN_REASONS != 0
