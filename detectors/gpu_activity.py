"""What a job's GPUs are doing while its logs are silent: computing, spinning in NCCL, or idle.

A job that stops logging while its GPUs keep *computing* (busy, drawing close to
the power they draw while training) is evaluating or taking a long step. A job
whose GPUs *spin* — busy but drawing far less power, the signature of NCCL's
busy-wait kernels waiting on a peer — or where one GPU idles while its peers
spin, is hung. Idle GPUs everywhere are a checkpoint write, a data stall or a
dead process: the logs must decide.

The training power level is learned per GPU from samples taken while the job
makes steps, so no absolute wattage is assumed (an H100 and an A10 differ by 5×).

>>> from trainguard.detectors.events import GpuSample
>>> act = GpuActivity()
>>> for t in range(0, 100, 10):
...     for g in range(4):
...         act.observe(GpuSample(ts=float(t), node="n1", gpu=g, util_pct=99.0, power_w=600.0), stepping=True)
>>> for t in (110, 120):
...     for g in range(4):
...         act.observe(GpuSample(ts=float(t), node="n1", gpu=g, util_pct=100.0, power_w=180.0), stepping=False)
>>> act.verdict(since=100.0).state
'spinning'
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from statistics import median
from typing import Any

import numpy as np

from trainguard.detectors.events import GpuSample
from trainguard.detectors.frames import POWER, UTIL, GpuFrame, as_frame
from trainguard.detectors.gpu_windows import GpuKey, GpuWindows

BUSY_UTIL = 50.0  # % utilisation: the GPU is doing something
SPIN_UTIL = 85.0  # NCCL's busy-wait kernels keep utilisation pinned near 100 %
IDLE_UTIL = 10.0
SPIN_POWER = 0.55  # spinning draws at most this share of the GPU's training power
TRAIN_EWM = 0.1  # weight of a new stepping sample in the training power level
# A node's stepping samples kept (their utilisation and power only, as rows of an array) before they are
# folded into its levels: the levels are read only when a job goes quiet, and folding a node's samples at
# once, as columns, costs less than folding each as it comes. Copying the two rows while the frame is fresh
# costs less than reading old frames back (and keeps no frame alive for it).
LEARN_EVERY = 16


@dataclass(frozen=True, slots=True)
class Verdict:
    """``state``: computing | spinning | culprit_idle | idle | unknown (``writer_idle``: a culprit that is
    rank 0's GPU, which the job monitor tells apart); ``samples``: rounds seen since."""

    state: str
    samples: int
    suspects: list[GpuKey] = field(default_factory=list)
    why: str = ""


class GpuActivity:
    """Recent samples of one job's GPUs and their learned training power level."""

    def __init__(self, keep: int = 8) -> None:
        self.keep = keep
        # Each GPU's last ``keep`` samples as (ts, util, power); NaN (or, in older snapshots, None): not reported.
        self._recent: GpuWindows[Reading] = GpuWindows(keep, _reading)
        self._train_power: dict[str, dict[int, float]] = {}  # node -> GPU -> level
        self._unlearned: dict[str, _Stepping] = {}  # node -> its stepping samples not yet in the levels

    def __setstate__(self, state: dict[str, Any]) -> None:
        if type(state["_recent"]) is dict:  # a snapshot written before node windows: each GPU's (lists, once)
            keep = state["keep"]
            gpus = {k: deque(v, maxlen=keep) for k, v in state["_recent"].items()}
            state["_recent"] = GpuWindows.of_gpus(keep, _reading, gpus)
        levels = state["_train_power"]
        if levels and type(next(iter(levels))) is tuple:  # (once kept per (node, GPU))
            by_node: dict[str, dict[int, float]] = {}
            for (node, gpu), level in levels.items():
                by_node.setdefault(node, {})[gpu] = level
            state["_train_power"] = by_node
        unlearned = state.get("_unlearned")
        state["_unlearned"] = {}
        self.__dict__.update(state)
        for frame in unlearned if type(unlearned) is list else ():  # (frames, once; none in a snapshot)
            self._keep_stepping(frame)

    def __getstate__(self) -> dict[str, Any]:
        self._learn()  # (a snapshot holds the levels, not the samples they come from)
        return {**self.__dict__, "_unlearned": []}  # (a list, as versions that kept frames wrote and read it)

    @property
    def train_power(self) -> dict[str, dict[int, float]]:
        """Each GPU's learned training power level: node -> GPU -> watts."""
        self._learn()
        return self._train_power

    def observe(self, sample: GpuSample | GpuFrame, stepping: bool) -> None:
        """A sample or a node's frame; ``stepping``: the job was making steps when it was taken (it teaches
        the power level)."""
        frame = as_frame(sample)
        self._recent.append(frame)
        if stepping:
            self._keep_stepping(frame)

    def _keep_stepping(self, frame: GpuFrame) -> None:
        """Keep a stepping frame's utilisation and power rows until its node's are folded into the levels."""
        node, gpus = frame.node, frame.gpus
        pending = self._unlearned.get(node)
        if pending is None or (pending.gpus is not gpus and pending.gpus != gpus):
            if pending is not None:  # other GPUs than before: the node's samples so far first, in order
                self._fold(node, pending)
            if len(set(gpus)) < len(gpus):  # a GPU twice in a frame: its columns are not its GPUs' rows
                self._unlearned.pop(node, None)
                self._fold_frame(frame)
                return
            pending = self._unlearned[node] = _Stepping(gpus)
        pending.rows[pending.count] = frame.values[_UTIL_POWER]
        pending.count += 1
        if pending.count == LEARN_EVERY:
            self._fold(node, pending)

    def _learn(self) -> None:
        """Fold every node's kept stepping samples into the levels."""
        for node, pending in self._unlearned.items():
            self._fold(node, pending)
        self._unlearned = {}

    def _fold(self, node: str, pending: _Stepping) -> None:
        """A node's kept samples into its GPUs' levels (and out of ``pending``): which samples teach (busy,
        power reported) found as columns; then per GPU, the powers that do as Python floats, folded one by
        one — the arithmetic of frame by frame, bit for bit."""
        if not pending.count:
            return
        levels = self._train_power.get(node)
        if levels is None:
            levels = self._train_power[node] = {}
        util, power = pending.rows[: pending.count].transpose(1, 2, 0)  # each (GPU, sample)
        pending.count = 0
        teaching = (power == power) & (util >= BUSY_UTIL)  # (NaN compares false)
        columns = power.tolist() if teaching.all() else [p[t].tolist() for p, t in zip(power, teaching, strict=True)]
        for gpu, powers in zip(pending.gpus, columns, strict=True):
            _fold(levels, gpu, powers)

    def _fold_frame(self, frame: GpuFrame) -> None:
        """A frame holding a GPU twice, column by column."""
        levels = self._train_power.setdefault(frame.node, {})
        utils, powers = frame.values[UTIL].tolist(), frame.values[POWER].tolist()
        for gpu, util, power in zip(frame.gpus, utils, powers, strict=True):
            if power == power and util >= BUSY_UTIL:
                _fold(levels, gpu, [power])

    def forget(self) -> None:
        """The job restarted: recent samples no longer describe it (the learned levels still do)."""
        self._recent.clear()

    def verdict(self, since: float) -> Verdict:
        """What the GPUs did in the samples taken after ``since`` (the last step)."""
        per_gpu: dict[GpuKey, list[tuple[float, float | None, float | None]]] = {
            key: [s for s in recent if s[0] > since] for key, recent in self._recent.items(after=since)
        }
        per_gpu = {k: v for k, v in per_gpu.items() if v}
        if not per_gpu:
            return Verdict("unknown", 0)
        rounds = min(len(v) for v in per_gpu.values())
        util = {k: median(u for _, u, _ in v if _known(u)) for k, v in per_gpu.items() if _has(v, 1)}
        if not util:
            return Verdict("unknown", rounds)
        trained = self.train_power
        share = {
            k: median(p for _, _, p in v if _known(p)) / trained[k[0]][k[1]]
            for k, v in per_gpu.items()
            if _has(v, 2) and trained.get(k[0], {}).get(k[1])
        }
        busy = [k for k, u in util.items() if u >= SPIN_UTIL]
        idle = [k for k, u in util.items() if u < IDLE_UTIL]
        if idle and len(busy) >= max(2, len(util) // 2):
            return Verdict("culprit_idle", rounds, sorted(idle), "idle while its peers spin in NCCL kernels")
        if len(idle) == len(util):
            return Verdict("idle", rounds, why="every GPU of the job is idle")
        if not share:
            return Verdict("unknown", rounds, why="no training power level learned yet")
        low = [k for k in busy if share.get(k, 1.0) <= SPIN_POWER]
        if busy and len(low) * 2 > len(util):
            level = median(share[k] for k in low)
            return Verdict("spinning", rounds, why=f"busy at {level:.0%} of training power: spinning in NCCL kernels")
        working = [k for k, u in util.items() if u >= BUSY_UTIL and share.get(k, 0.0) > SPIN_POWER]
        if len(working) * 2 > len(util):
            return Verdict("computing", rounds, why="busy near training power: computing (evaluation or a long step)")
        return Verdict("unknown", rounds, why="mixed activity")


Reading = tuple[float, float | None, float | None]  # a GPU's (ts, util, power)
_UTIL_POWER = slice(UTIL, UTIL + 2) if POWER == UTIL + 1 else [UTIL, POWER]  # (a view, where they are neighbours)


class _Stepping:
    """A node's stepping samples not yet folded: ``rows[i]`` holds sample ``i``'s utilisation and power
    rows (GPU columns as in ``gpus``)."""

    __slots__ = ("count", "gpus", "rows")

    def __init__(self, gpus: tuple[int, ...]) -> None:
        self.gpus = gpus
        self.rows = np.empty((LEARN_EVERY, 2, len(gpus)))
        self.count = 0


def _fold(levels: dict[int, float], gpu: int, powers: list[float]) -> None:
    """A GPU's training power level after these busy samples' powers: ``level + TRAIN_EWM * (power - level)``
    each, in order (a first sample sets it)."""
    if not powers:
        return
    level = levels.get(gpu)
    if level is None:
        level, powers = powers[0], powers[1:]
    for power in powers:
        level = level + TRAIN_EWM * (power - level)
    levels[gpu] = level


def _reading(frame: GpuFrame, i: int) -> Reading:
    values = frame.values
    return frame.ts, values.item(UTIL, i), values.item(POWER, i)  # (Python floats, without numpy scalars)


def _has(samples: list[tuple[float, float | None, float | None]], index: int) -> bool:
    return any(_known(s[index]) for s in samples)


def _known(value: float | None) -> bool:
    return value is not None and value == value
