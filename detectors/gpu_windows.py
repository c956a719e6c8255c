"""The last few samples of each GPU, kept a node's frame at a time.

A node's GPUs report together, and frame after frame the same GPUs: then the node's last
``keep`` frames *are* each of its GPUs' last ``keep`` samples, and one append per frame keeps
them — no per-GPU work until someone asks. A node whose frames change GPUs (one fell off the
bus, one reported twice in an instant, a sweep cut in two where a block of the replay ends)
has its GPUs kept one by one — what every window means anyway: a GPU's last ``keep`` samples,
whatever its neighbours did — until ``keep`` frames in a row hold every one of its GPUs again.

>>> import numpy as np
>>> from trainguard.detectors.frames import FIELDS
>>> windows = GpuWindows(keep=2, sample=lambda frame, i: frame.ts)
>>> for ts in (10.0, 20.0, 30.0):
...     windows.append(GpuFrame(ts, "n1", (0, 1), np.zeros((len(FIELDS), 2))))
>>> windows.append(GpuFrame(40.0, "n1", (0,), np.zeros((len(FIELDS), 1))))  # GPU 1 fell off the bus
>>> dict(windows.items())
{('n1', 0): [30.0, 40.0], ('n1', 1): [20.0, 30.0]}
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

from trainguard.detectors.frames import GpuFrame

GpuKey = tuple[str, int]
T = TypeVar("T")

__all__ = ["GpuKey", "GpuWindows"]


class GpuWindows(Generic[T]):
    """Each GPU's last ``keep`` samples, as ``sample(frame, column)`` makes them (a module-level function:
    the windows are pickled with the detector that keeps them)."""

    def __init__(self, keep: int, sample: Callable[[GpuFrame, int], T]) -> None:
        self.keep = keep
        self.sample = sample
        self._frames: dict[str, deque[GpuFrame]] = {}  # nodes whose frames all held the same GPUs
        self._gpus: dict[GpuKey, deque[T]] = {}  # GPUs of the other nodes, one by one
        self._apart: dict[str, set[int]] = {}  # those other nodes, and their GPUs
        self._runs: dict[str, deque[GpuFrame]] = {}  # their latest frames of the same GPUs, up to ``keep``
        self._order: dict[GpuKey, None] = {}  # every GPU, in the order first seen

    @classmethod
    def of_gpus(cls, keep: int, sample: Callable[[GpuFrame, int], T], gpus: dict[GpuKey, deque[T]]) -> GpuWindows[T]:
        """Windows kept GPU by GPU (as detectors' snapshots before these windows held them)."""
        windows = cls(keep, sample)
        windows._gpus = gpus
        for node, gpu in gpus:
            windows._apart.setdefault(node, set()).add(gpu)
        windows._order = dict.fromkeys(gpus)
        return windows

    def append(self, frame: GpuFrame) -> None:
        """A node's frame: each of its GPUs' newest sample."""
        node = frame.node
        frames = self._frames.get(node)
        if frames is not None:
            if _same_gpus(frames[-1], frame):
                frames.append(frame)
                return
            self._take_apart(node, frames)  # other GPUs than before: one by one from now on
        elif node not in self._apart:
            for key in frame.keys:
                self._order.setdefault(key)
            if len(set(frame.gpus)) == len(frame.gpus):
                self._frames[node] = deque((frame,), maxlen=self.keep)
                return
            self._apart[node] = set()  # a GPU twice in one frame: its columns are not its windows
        self._add(frame)
        run = self._runs.get(node)
        if run and _same_gpus(run[-1], frame):
            run.append(frame)
        else:
            run = self._runs[node] = deque((frame,), maxlen=self.keep)
        if len(run) == self.keep and len(frame.gpus) == len(self._apart[node]) == len(set(frame.gpus)):
            self._rejoin(node, run)

    def _add(self, frame: GpuFrame) -> None:
        """A frame of a node kept one GPU at a time."""
        sample, gpus = self.sample, self._gpus
        node_gpus = self._apart[frame.node]
        for i, key in enumerate(frame.keys):
            window = gpus.get(key)
            if window is None:
                window = gpus[key] = deque(maxlen=self.keep)
                self._order.setdefault(key)
                node_gpus.add(key[1])
            window.append(sample(frame, i))

    def _take_apart(self, node: str, frames: deque[GpuFrame]) -> None:
        del self._frames[node]
        self._apart[node] = set()
        for frame in frames:
            self._add(frame)

    def _rejoin(self, node: str, frames: deque[GpuFrame]) -> None:
        """The node's last ``keep`` frames held each of its GPUs once: they are its windows again."""
        for gpu in self._apart.pop(node):
            del self._gpus[node, gpu]
        del self._runs[node]
        self._frames[node] = frames

    def items(self, last: int | None = None, after: float | None = None) -> Iterator[tuple[GpuKey, list[T]]]:
        """``(GPU, its samples, oldest first)`` for every GPU, in the order they were first seen; ``last``: only
        each GPU's newest that many. ``after``: of a node kept a frame at a time, only the samples of its
        frames taken after then (a GPU kept one by one gives all of its: their time is in the caller's
        samples, which this does not read) — the samples are made only for those frames."""
        sample, cut = self.sample, -last if last else 0
        chosen: dict[str, list[GpuFrame]] = {}  # each node's frames to sample, chosen once for its GPUs
        for key, frames, i in self._where():
            if frames is None:
                window = self._gpus[key]
                yield key, list(window)[cut:] if cut else list(window)
                continue
            node_frames = chosen.get(key[0])
            if node_frames is None:
                node_frames = list(frames)[cut:] if cut else list(frames)
                if after is not None:
                    node_frames = [frame for frame in node_frames if frame.ts > after]
                chosen[key[0]] = node_frames
            yield key, [sample(frame, i) for frame in node_frames]

    def newest_frames(self) -> Iterator[GpuFrame]:
        """The newest frame of each node kept a frame at a time (its GPUs were all seen last then)."""
        for frames in self._frames.values():
            yield frames[-1]

    def newest_apart(self) -> Iterator[tuple[GpuKey, T]]:
        """``(GPU, its newest sample)`` for each GPU kept one by one."""
        for key, window in self._gpus.items():
            yield key, window[-1]

    def _where(self) -> Iterator[tuple[GpuKey, deque[GpuFrame] | None, int]]:
        """Each GPU with its node's frames and its column there (``None, -1``: kept one by one)."""
        columns: dict[str, dict[int, int]] = {}
        for key in self._order:
            node, gpu = key
            frames = self._frames.get(node)
            if frames is None:
                yield key, None, -1
                continue
            where = columns.get(node)
            if where is None:
                where = columns[node] = {g: i for i, g in enumerate(frames[-1].gpus)}
            yield key, frames, where[gpu]

    def __len__(self) -> int:
        """How many GPUs have samples."""
        return len(self._order)

    def clear(self) -> None:
        self._frames.clear()
        self._gpus.clear()
        self._apart.clear()
        self._runs.clear()
        self._order.clear()


def _same_gpus(before: GpuFrame, frame: GpuFrame) -> bool:
    """Whether two frames of a node hold the same GPUs in the same columns (their keys are shared, mostly)."""
    return before.keys is frame.keys or before.keys == frame.keys
