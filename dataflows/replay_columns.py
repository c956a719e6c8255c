"""A replay's GPU telemetry read as columns, straight into frames.

GPU samples are most of a cluster's records. Instead of a decoded object per row,
each block of a ``gpu`` file (a Parquet record batch, or a few megabytes of JSON
Lines parsed by polars) becomes columns, is checked as columns, and is cut into
:class:`~trainguard.detectors.frames.GpuFrame` s: one per run of rows of one node
and timestamp. A block the columns cannot vouch for — a field of an unexpected
type, a missing node, a timestamp out of range, an over-long line — is read record
by record instead, through the decoder and its lenient rules, so what reaches the
flow and the dead-letter sink is what the record path would give.

>>> import numpy as np
>>> block = GpuBlock(ts=np.array([10.0, 10.0, 20.0]), names=["n1"], node=np.array([0, 0, 0]), gpu=[0, 1, 0],
...                  values=np.full((len(FIELDS), 3), np.nan), uuid=None, pci_bus_id=None)
>>> [(f.ts, f.gpus) for f in block.frames(np.array([10.0, 10.0, 20.0]), [0, 1, 2])[1]]
[(10.0, (0, 1)), (20.0, (0,))]
"""

from __future__ import annotations

import contextlib
import os
import queue
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from trainguard.detectors.events import MAX_TS, MIN_TS, Event, decode_block, record_lines
from trainguard.detectors.frames import FIELDS, INTEGER_FIELDS, GpuFrame, rare_rows, same_sweep

# polars' thread pool does not survive fork(): a forked process (a worker of ``replay --processes``)
# has msgspec decode each block of JSON Lines at once instead (Parquet is read through Arrow, which does).
_FORKED = False


def _forked() -> None:
    global _FORKED
    _FORKED = True


os.register_at_fork(after_in_child=_forked)

_T = TypeVar("_T")
# JSON Lines read this much at a time. Fewer, larger blocks mean fewer calls that must take the interpreter
# back (on a GPU-only replay of 1.44 M records: 4 MiB 6.1 s, 8 MiB 5.9 s, 16 MiB 5.2 s, 32 MiB 5.7 s).
_BLOCK_BYTES = 16 << 20
# The first block is small: the flow waits for it, with nothing read ahead yet.
_FIRST_BLOCK_BYTES = 1 << 20
_BATCH_ROWS = 65_536  # Parquet rows per record batch
# Blocks read ahead: the merge often asks for a GPU file's next two blocks in a row (on the same replay,
# 8 MiB blocks: the flow waited on the reader ~0.7 s with one block ready, ~0.55 s with two).
_AHEAD = 2
_TEXT = ("node", "uuid", "pci_bus_id")
# What the columns must be for the block to be read as columns (ints widen to float64, null is NaN).
_SCHEMA: dict[str, pl.DataType] = {
    "ts": pl.Float64(),
    "node": pl.String(),
    "gpu": pl.Int64(),
    "uuid": pl.String(),
    "pci_bus_id": pl.String(),
    **{name: pl.Int64() if name in INTEGER_FIELDS else pl.Float64() for name in FIELDS},
}


@dataclass
class GpuBlock:
    """Checked columns of consecutive GPU rows: every row has a node, a GPU and a plausible timestamp."""

    ts: np.ndarray
    names: list[str]  # the block's node names
    node: np.ndarray  # each row's node, as its index in ``names``
    gpu: list[int]
    values: np.ndarray  # (field, row), NaN = null
    uuid: list[str | None] | None
    pci_bus_id: list[str | None] | None

    def __len__(self) -> int:
        return len(self.ts)

    def frames(self, keys: np.ndarray, offsets: list[int]) -> tuple[list[float], list[GpuFrame], list[int]]:
        """The block cut into frames — runs of one node and timestamp, each GPU once — with each frame's
        sort key and offset (its first row's)."""
        names, gpu = self.names, self.gpu
        starts = self._starts()
        rows = rare_rows(self.values)
        rare, rare_gpus = np.logical_or.reduceat(rows, starts).tolist(), rows.tolist()
        ends = [*starts[1:], len(gpu)]
        # Each frame's timestamp and node as Python objects, in one call each (not a numpy scalar per frame).
        ts, node = self.ts[starts].tolist(), [names[code] for code in self.node[starts].tolist()]
        values, uuid, pci = self.values, self.uuid, self.pci_bus_id
        frames = [
            GpuFrame(
                at,
                name,
                tuple(gpu[a:b]),
                values[:, a:b].copy(),  # a frame outlives its block: it must not pin the block's arrays
                uuid[a:b] if uuid else None,
                pci[a:b] if pci else None,
                None,
                r,
                rare_gpus[a:b] if r else None,
            )
            for a, b, r, at, name in zip(starts, ends, rare, ts, node, strict=True)
        ]
        return keys[starts].tolist(), frames, [offsets[a] for a in starts]

    def _starts(self) -> list[int]:
        """Where each frame begins: a new node or timestamp, as columns; where a run holds a GPU twice, the
        rule of :func:`~trainguard.detectors.frames.same_sweep` row by row."""
        ts, gpu, codes = self.ts, np.asarray(self.gpu), self.node
        new = np.empty(len(ts), dtype=bool)
        new[0] = True
        np.not_equal(ts[1:], ts[:-1], out=new[1:])
        new[1:] |= codes[1:] != codes[:-1]
        # No GPU twice in a run: GPU indexes rising within every run (as collectors sweep them) says so in one
        # pass; otherwise the run's GPUs sorted say it.
        rising = new[1:] | (gpu[1:] > gpu[:-1])
        if rising.all():
            return np.flatnonzero(new).tolist()
        run = np.cumsum(new)
        order = np.lexsort((gpu, run))
        if not ((run[order][1:] == run[order][:-1]) & (gpu[order][1:] == gpu[order][:-1])).any():
            return np.flatnonzero(new).tolist()
        return sweep_starts(ts.tolist(), codes.tolist(), self.gpu)  # (equal indexes, equal names)


def sweep_starts(ts: list[float], node: list[Any], gpus: list[int]) -> list[int]:
    """Where each frame of these rows begins, by :func:`~trainguard.detectors.frames.same_sweep`, row by row.

    >>> sweep_starts([1.0, 1.0, 1.0, 2.0], ["a", "a", "a", "a"], [0, 1, 1, 0])
    [0, 2, 3]
    """
    starts = [0]
    run_gpus = {gpus[0]}
    for i in range(1, len(ts)):
        first = starts[-1]
        if not same_sweep(ts[i], node[i], gpus[i], ts[first], node[first], run_gpus):
            starts.append(i)
            run_gpus = set()
        run_gpus.add(gpus[i])
    return starts


def _checked(table: pa.Table) -> GpuBlock | None:
    """A Parquet batch as checked columns, or ``None`` when a column's type is not the contract's or a row
    would not decode as it stands."""
    names = set(table.column_names)
    if not {"ts", "node", "gpu"} <= names:
        return None
    for name in names & _SCHEMA.keys():
        kind = table.schema.field(name).type
        if not (pa.types.is_null(kind) or (_text(kind) if name in _TEXT else _numeric(name, kind))):
            return None
        if pa.types.is_uint64(kind) and (pc.max(table[name]).as_py() or 0) >= 1 << 63:
            return None  # more than the contract's 64-bit integers hold
    if _FORKED:  # polars may not run here (its thread pool does not survive fork): Arrow's own columns
        return _arrow_columns(table, names)
    typed = [
        pl.col(name).cast(kind) if name in names else pl.lit(None, kind).alias(name) for name, kind in _SCHEMA.items()
    ]
    return _columns(pl.from_arrow(table.select([name for name in _SCHEMA if name in names])).select(typed))  # type: ignore[union-attr]


_NODES = pl.col("node").unique()
# Node names polars could have read from something other than a JSON string (a number, true, an array...).
_NAMES_IN_DOUBT = (
    _NODES.cast(pl.Float64, strict=False).is_not_null()
    | _NODES.is_in(["true", "false"])
    | _NODES.str.starts_with("[")
    | _NODES.str.starts_with("{")
).any()
# ts, node (its rank among the block's names, from 1), gpu and every field, as one float64 array (null is NaN).
_NUMBERS = [
    pl.col("ts"),
    pl.col("node").rank("dense").cast(pl.Float64),
    pl.col("gpu").cast(pl.Float64),
    *(pl.col(name).cast(pl.Float64) for name in FIELDS),
]


def _columns(frame: pl.DataFrame) -> GpuBlock | None:
    """Rows with the contract's columns and types as checked columns (see :func:`_block`).

    This runs in the read-ahead thread, where each call that lets go of the interpreter waits to take it
    back while the flow holds it (up to the switch interval): hence one array for every number, and few calls.
    """
    text = [frame.get_column(name) for name in ("uuid", "pci_bus_id")]
    uuid, pci = (column.to_list() if column.null_count() < len(column) else None for column in text)
    return _block(
        frame.select(_NUMBERS).to_numpy(),  # (row, column), column-major: each column contiguous
        lambda: frame.get_column("node").unique().sort().to_list(),
        lambda: frame.get_column("gpu").to_list(),
        uuid,
        pci,
    )


def _arrow_columns(table: pa.Table, names: set[str]) -> GpuBlock | None:
    """What :func:`_columns` gives, from Arrow and numpy alone (node codes: their order of first appearance)."""
    if table["node"].null_count or table["gpu"].null_count:
        return None
    nodes = pc.dictionary_encode(table["node"].combine_chunks())
    numbers = np.full((table.num_rows, 3 + len(FIELDS)), np.nan, order="F")
    numbers[:, 0] = table["ts"].to_numpy(zero_copy_only=False)  # (null: NaN)
    numbers[:, 1] = nodes.indices.to_numpy() + 1
    numbers[:, 2] = table["gpu"].to_numpy()
    for i, name in enumerate(FIELDS):
        if name in names:
            numbers[:, 3 + i] = table[name].to_numpy(zero_copy_only=False)
    text = {
        name: table[name].to_pylist() if name in names and table[name].null_count < table.num_rows else None
        for name in ("uuid", "pci_bus_id")
    }
    return _block(numbers, nodes.dictionary.to_pylist, table["gpu"].to_pylist, text["uuid"], text["pci_bus_id"])


def _block(
    numbers: np.ndarray,
    names: Callable[[], list[str]],
    gpus: Callable[[], list[int]],
    uuid: list[str | None] | None,
    pci: list[str | None] | None,
) -> GpuBlock | None:
    """The block from ``numbers`` (row × ts, node code from 1, gpu, every field; NaN is null), or ``None``
    when a row would not decode as it stands: no node, GPU or timestamp; a timestamp out of range; an
    infinity (the record path nulls it, and counts it). ``names`` and ``gpus`` are asked only of a good block."""
    if np.isnan(numbers[:, 1:3]).any():
        return None
    ts = numbers[:, 0]
    if not ((ts >= MIN_TS) & (ts <= MAX_TS)).all():  # (NaN fails too)
        return None
    values = numbers[:, 3:].T  # (field, row), rows contiguous
    if np.isinf(values).any():
        return None
    return GpuBlock(ts, names(), numbers[:, 1].astype(np.int64) - 1, gpus(), values, uuid, pci)


def _text(kind: pa.DataType) -> bool:
    return pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_string_view(kind)


def _numeric(name: str, kind: pa.DataType) -> bool:
    """Whether a column of this type reads as the contract's field: integers only where it wants an integer."""
    return pa.types.is_integer(kind) or (name not in INTEGER_FIELDS and name != "gpu" and pa.types.is_floating(kind))


def jsonl_blocks(path: Path) -> Iterator[tuple[GpuBlock | list[Event] | None, bytes]]:
    """``(columns, or the block's records decoded at once, or None; the block's bytes)`` for each block of
    whole lines of a JSON Lines file. Records where the columns cannot vouch for the block (or polars may
    not run, after a fork) but the decoder takes every line as it stands; ``None``: line by line.

    The next block is read and parsed ahead, in a thread, while the flow works on this one: reading the
    file and polars' parse let go of the interpreter, so they run on another core."""
    if _FORKED:  # (msgspec's decoding holds the interpreter: nothing to gain from a thread)
        yield from _jsonl_blocks(path)
    else:
        yield from read_ahead(_jsonl_blocks(path), _AHEAD)


def _jsonl_blocks(path: Path) -> Iterator[tuple[GpuBlock | list[Event] | None, bytes]]:
    for block in line_blocks(path, _BLOCK_BYTES, _FIRST_BLOCK_BYTES):
        columns = _parse_lines(block)
        yield (columns if columns is not None else decode_block("gpu", block)), block


def read_ahead(items: Iterator[_T], depth: int = 1) -> Iterator[_T]:
    """``items``, each made in a thread while the one before is used (at most ``depth`` waiting); what the
    thread raises is raised here, in order. Closing this generator stops the thread at its next item.

    >>> list(read_ahead(iter(range(5))))
    [0, 1, 2, 3, 4]
    """
    ready: queue.Queue[tuple[bool, Any]] = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def make() -> None:
        try:
            for item in items:
                if stop.is_set():
                    return
                ready.put((True, item))
            ready.put((False, None))
        except BaseException as error:  # handed to the reader, which raises it where it was asked for
            ready.put((False, error))
        finally:
            close = getattr(items, "close", None)
            if close is not None:
                close()  # (here, in the thread that runs it: its file closes now, not when collected)

    thread = threading.Thread(target=make, name="trainguard-read-ahead", daemon=True)
    thread.start()
    try:
        while True:
            more, item = ready.get()
            if not more:
                if item is not None:
                    raise item
                return
            yield item
    finally:
        stop.set()
        while thread.is_alive():  # unblock a thread waiting to put, so it sees ``stop``
            with contextlib.suppress(queue.Empty):
                ready.get(timeout=0.05)


def line_blocks(path: Path, size: int, first: int | None = None) -> Iterator[bytes]:
    """A file's bytes about ``size`` at a time (the first block about ``first``, if smaller), cut after a
    newline (the last block gets one if it lacks it).

    A block's partial last line is read again with the next block rather than joined to it: one copy of a
    block, not two (they hold the interpreter, which a reading-ahead thread takes from the flow).
    """
    with path.open("rb") as fh:
        tail = b""
        want = min(first or size, size)
        while True:
            data = fh.read(want)
            want = size
            if not data:
                break
            if tail:  # (a line longer than a block)
                data, tail = tail + data, b""
            cut = data.rfind(b"\n") + 1
            if cut == 0:
                tail = data
                continue
            if cut < len(data):
                fh.seek(cut - len(data), os.SEEK_CUR)
                data = data[:cut]
            yield data
        if tail:
            yield tail + b"\n"


def _parse_lines(block: bytes) -> GpuBlock | None:
    if _FORKED:
        return None
    lines = record_lines(block)
    if lines is None:
        return None
    try:
        # Read to the contract's types: a value of another type (a numeric string, a boolean, a float
        # where an integer belongs, a list of reasons) fails the block, which then goes record by record.
        frame = pl.read_ndjson(block, schema=_SCHEMA)
    except pl.exceptions.PolarsError:
        return None
    if frame.height != lines:
        return None
    # polars reads a number, a boolean or an object where a node's name belongs as its text; the decoder
    # refuses those. Only a block holding a name that could be one is asked of its bytes: a count holds the
    # interpreter (~7 ms a pass over 16 MiB), and the flow waits for it.
    if frame.select(_NAMES_IN_DOUBT).item() and block.count(b'"node":"') + block.count(b'"node": "') != lines:
        return None
    return _columns(frame)


def parquet_blocks(path: Path) -> Iterator[tuple[GpuBlock | None, pa.RecordBatch]]:
    """``(columns or None, the batch)`` for each record batch of a Parquet file (read ahead, in a thread)."""
    return read_ahead(((_checked(pa.Table.from_batches([batch])), batch) for batch in _batches(path)), _AHEAD)


def _batches(path: Path) -> Iterator[pa.RecordBatch]:
    yield from pq.ParquetFile(path).iter_batches(batch_size=_BATCH_ROWS)
