"""A node's GPU samples at one instant, as one frame of columns.

A node's GPUs report together — an NVML sweep, a dcgm-exporter scrape — so the flow
carries and judges them together: one :class:`GpuFrame` per node and timestamp, its
metrics a ``(field, GPU)`` array of float64 (null is NaN), instead of a record object
per GPU. The per-GPU records of the wire contract become frames at the router (or in
the replay reader); a detector that wants records still gets them (:meth:`GpuFrame.samples`).

>>> from trainguard.detectors.events import GpuSample
>>> frame = GpuFrame.from_samples([GpuSample(ts=10.0, node="n1", gpu=g, util_pct=90.0 + g, ecc_sbe_total=g)
...                                for g in range(4)])
>>> frame.node, frame.gpus, frame.column("util_pct").tolist(), len(frame)
('n1', (0, 1, 2, 3), [90.0, 91.0, 92.0, 93.0], 4)
>>> frame.sample(2).ecc_sbe_total, frame.sample(2).xid, frame.rare
(2, None, False)
"""

from __future__ import annotations

from collections.abc import Container, Iterator, Sequence
from operator import attrgetter

import msgspec
import numpy as np

from trainguard.detectors.events import GpuSample

# NVML clock-throttle reasons that mean the GPU is slowed by heat or power delivery (HW slowdown,
# SW/HW thermal, HW power brake) — not the routine power cap.
SLOWDOWN_REASONS = 0x8 | 0x20 | 0x40 | 0x80
_REASON_BITS = {"hw_slowdown": 0x8, "sw_thermal": 0x20, "hw_thermal": 0x40, "hw_power_brake": 0x80}

# Row order matters: the four cumulative counters first, so "did any counter move?" is one
# comparison of a contiguous block; then the fields whose mere presence is news.
FIELDS: tuple[str, ...] = (
    "ecc_sbe_total",
    "ecc_dbe_total",
    "pcie_replay_total",
    "nvlink_crc_total",
    "remapped_rows_pending",
    "remapped_rows_failed",
    "xid",
    "throttle_reasons",
    "util_pct",
    "power_w",
    "temp_c",
    "sm_clock_mhz",
    "mem_used_mib",
    "remapped_rows_correctable",
    "remapped_rows_uncorrectable",
    "nvlink_replay_total",
    "nvlink_recovery_total",
)
COLUMN = {name: i for i, name in enumerate(FIELDS)}
COUNTERS = 4  # rows [0, COUNTERS) are the counters whose change the health rules look at
UTIL, POWER = COLUMN["util_pct"], COLUMN["power_w"]
_PENDING, _FAILED, _XID, _THROTTLE = (
    COLUMN[f] for f in ("remapped_rows_pending", "remapped_rows_failed", "xid", "throttle_reasons")
)
# Fields GpuSample types as integers: converted back to int when a frame row becomes a record.
INTEGER_FIELDS = frozenset(
    f.name
    for f in msgspec.structs.fields(GpuSample)
    if f.name in COLUMN and f.type in (int | None, int | list[str] | None)
)
_READ = attrgetter(*FIELDS)
_INTEGER_ROWS = tuple(i for i, name in enumerate(FIELDS) if name in INTEGER_FIELDS)


def throttle_mask(reasons: int | list[str] | None) -> int:
    """The NVML bitmask from an int or a list of reason names.

    >>> throttle_mask(["clocks_event_reason_hw_thermal_slowdown"]), throttle_mask(0x4), throttle_mask(None)
    (64, 4, 0)
    """
    if reasons is None:
        return 0
    if isinstance(reasons, int):
        return reasons
    return sum(bit for name, bit in _REASON_BITS.items() if any(name in r.lower() for r in reasons))


def rare_rows(values: np.ndarray) -> np.ndarray:
    """Per GPU (column): does its sample carry news on its own — an Xid, a row remap pending or failed,
    a slowdown throttle reason? ``values`` is ``(field, GPU)``, any number of GPUs (a whole file's)."""
    reasons = values[_THROTTLE]
    throttle = np.where(reasons == reasons, reasons, 0.0).astype(np.int64)  # NaN (unreported): no reason
    return (
        ~np.isnan(values[_XID])
        | (values[_PENDING] > 0)  # (NaN compares false)
        | (values[_FAILED] > 0)
        | ((throttle & SLOWDOWN_REASONS) != 0)
    )


# A node sends the same GPUs frame after frame: their keys are made once (and shared, never mutated).
_KEYS: dict[tuple[str, tuple[int, ...]], tuple[tuple[str, int], ...]] = {}
_KEYS_KEPT = 200_000


class GpuFrame:
    """One node's GPU samples at ``ts``: ``gpus`` (indexes), ``values`` (``len(FIELDS)`` × GPUs, NaN = null).

    ``rare``: some GPU's sample is news on its own (:func:`rare_rows`); a frame that is not rare
    and whose counters equal the node's previous frame needs no per-GPU judging at all.
    ``job_id`` is stamped by the router (the job running on the node), never by producers.
    """

    __slots__ = (
        "_counters",
        "_made",
        "_rare_gpus",
        "gpus",
        "job_id",
        "keys",
        "node",
        "pci_bus_id",
        "rare",
        "ts",
        "uuid",
        "values",
    )

    def __init__(
        self,
        ts: float,
        node: str,
        gpus: tuple[int, ...],
        values: np.ndarray,
        uuid: Sequence[str | None] | None = None,
        pci_bus_id: Sequence[str | None] | None = None,
        job_id: str | None = None,
        rare: bool | None = None,
        rare_gpus: list[bool] | None = None,
    ) -> None:
        self.ts = ts
        self.node = node
        self.gpus = gpus
        self.values = values
        self.uuid = uuid
        self.pci_bus_id = pci_bus_id
        self.job_id = job_id
        self.rare = bool(rare_rows(values).any()) if rare is None else rare
        # ``(node, gpu)`` of each column: the key per-GPU state is kept under (read several times a frame).
        keys = _KEYS.get((node, gpus))
        if keys is None:
            if len(_KEYS) >= _KEYS_KEPT:
                _KEYS.clear()
            keys = _KEYS[node, gpus] = tuple([(node, g) for g in gpus])
        self.keys = keys
        self._counters: bytes | None = None  # counter_key(), once asked (a frame's values never change)
        self._rare_gpus = rare_gpus  # rare_gpus(), if whoever cut the frame worked it out already
        self._made: dict[int, GpuSample] | None = None  # sample(i) once made (GPU health asks twice: now, as last)

    def __len__(self) -> int:
        return len(self.gpus)

    def __repr__(self) -> str:
        return f"GpuFrame(ts={self.ts!r}, node={self.node!r}, gpus={self.gpus!r}, job_id={self.job_id!r})"

    def __getstate__(self) -> tuple[object, ...]:
        return (self.ts, self.node, self.gpus, self.values, self.uuid, self.pci_bus_id, self.job_id, self.rare)

    def __setstate__(self, state: tuple[object, ...]) -> None:
        self.__init__(*state)  # type: ignore[misc]

    def column(self, field: str) -> np.ndarray:
        """One field across the frame's GPUs (NaN where a GPU did not report it)."""
        return self.values[COLUMN[field]]

    def rare_gpus(self) -> list[bool]:
        """Per GPU: whether its sample is news on its own (:func:`rare_rows` of the frame)."""
        found = self._rare_gpus
        if found is None:
            found = self._rare_gpus = rare_rows(self.values).tolist()
        return found

    def counter_key(self) -> bytes:
        """The cumulative counters of every GPU, as bytes: equal bytes, no counter moved."""
        key = self._counters
        if key is None:
            key = self._counters = self.values[:COUNTERS].tobytes()
        return key

    def sample(self, i: int) -> GpuSample:
        """Column ``i`` as the wire contract's record (made once: not to be changed)."""
        made = self._made
        if made is None:
            made = self._made = {}
        found = made.get(i)
        if found is None:
            found = made[i] = self._record(i)
        return found

    def _record(self, i: int) -> GpuSample:
        fields: dict[str, object] = {}
        for row, value in enumerate(self.values[:, i].tolist()):
            if value == value:  # not NaN
                fields[FIELDS[row]] = int(value) if row in _INTEGER_ROWS else value
        return GpuSample(
            ts=self.ts,
            node=self.node,
            gpu=self.gpus[i],
            uuid=self.uuid[i] if self.uuid else None,
            pci_bus_id=self.pci_bus_id[i] if self.pci_bus_id else None,
            job_id=self.job_id,
            **fields,  # type: ignore[arg-type]
        )

    def samples(self) -> Iterator[GpuSample]:
        """Every GPU's record, in column order (new ones: a plugin may do with them as it likes)."""
        return (self._record(i) for i in range(len(self.gpus)))

    @classmethod
    def from_samples(cls, samples: Sequence[GpuSample]) -> GpuFrame:
        """One frame from records of one node at one timestamp (the first record's), in their order."""
        first = samples[0]
        rows = [_READ(s) for s in samples]
        if any(type(s.throttle_reasons) is list for s in samples):  # reason names: the bitmask they mean
            rows = [(*r[:_THROTTLE], throttle_mask(r[_THROTTLE]), *r[_THROTTLE + 1 :]) for r in rows]
        rare = any(
            r[_XID] is not None or r[_PENDING] or r[_FAILED] or (r[_THROTTLE] or 0) & SLOWDOWN_REASONS for r in rows
        )
        values = np.array(rows, dtype=np.float64).T.copy()  # None is NaN
        uuid = [s.uuid for s in samples] if any(s.uuid for s in samples) else None
        pci = [s.pci_bus_id for s in samples] if any(s.pci_bus_id for s in samples) else None
        gpus = tuple(s.gpu for s in samples)
        return cls(float(first.ts), first.node, gpus, values, uuid, pci, first.job_id, rare)  # type: ignore[arg-type]


def same_sweep(ts: float, node: str, gpu: int, first_ts: float, first_node: str, gpus: Container[int]) -> bool:
    """Whether a sample (``ts``, ``node``, ``gpu``) goes in the frame begun at ``first_ts`` on ``first_node``
    that holds ``gpus`` so far: the same node and instant, and a GPU not yet in it (a second report of one
    GPU is judged against the first, so it starts a new frame). The one rule, for records and columns."""
    return ts == first_ts and node == first_node and gpu not in gpus


def nulls(values: list[float]) -> list[float | None]:
    """A frame's values as a record has them: NaN is null."""
    return [None if v != v else v for v in values]


def as_frame(event: GpuSample | GpuFrame) -> GpuFrame:
    """A frame, whatever came: a lone record is a frame of one GPU."""
    return event if type(event) is GpuFrame else GpuFrame.from_samples([event])  # type: ignore[list-item]
