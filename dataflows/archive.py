"""A rolling, date-partitioned Parquet archive written atomically.

One writer per dataset buffers rows and writes a new file when ``roll_rows``
rows are buffered, ``roll_s`` seconds have passed, an epoch ends (Bytewax
snapshots the flow: everything before a snapshot is on disk, so a ``kill -9``
followed by a resume loses nothing), or the flow ends. A file is written
under a hidden temporary name and renamed into place, so a crash leaves either
a whole file or none, and ``polars.scan_parquet(DIR / "**/*.parquet")`` always
reads the archive.

Layout: ``DIR/<dataset>/date=YYYY-MM-DD/part-<worker>-<seq>-<stamp>.parquet``.
"""

from __future__ import annotations

import os
import time
import uuid
import weakref
from collections import defaultdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import msgspec
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
from bytewax.outputs import FixedPartitionedSink, StatefulSinkPartition

from trainguard.actions.records import Action
from trainguard.detectors.events import Anomaly, DeadLetter, StackGroup
from trainguard.detectors.lifecycle import latest_records

_TS = pa.timestamp("us", tz="UTC")
_STACK_GROUP = pa.struct(
    [
        ("ranks", pa.list_(pa.int64())),
        ("nodes", pa.list_(pa.string())),
        ("processes", pa.int64()),
        ("where", pa.string()),
        ("frames", pa.list_(pa.string())),
        ("state", pa.string()),
        ("outlier", pa.bool_()),
    ]
)

SCHEMAS: dict[str, pa.Schema] = {
    "anomalies": pa.schema(
        [
            ("anomaly_id", pa.string()),
            ("detected_at", _TS),
            ("onset_ts", _TS),
            ("kind", pa.string()),
            ("category", pa.string()),
            ("layer", pa.string()),
            ("transient", pa.bool_()),
            ("job_id", pa.string()),
            ("nodes", pa.list_(pa.string())),
            ("ranks", pa.list_(pa.int64())),
            ("gpus", pa.list_(pa.string())),
            ("confidence", pa.float64()),
            ("evidence", pa.list_(pa.string())),
            # Since the anomaly lifecycle: files written before lack these columns (read with
            # :func:`read_dataset`, which fills them with nulls).
            ("severity", pa.string()),
            ("remedy", pa.string()),
            ("resolved_at", _TS),
            ("resolution", pa.string()),
            # Since 0.2.
            ("summary", pa.string()),
            ("runbook_url", pa.string()),
            # Since schema version 3: who named the culprit, the ranks' stack groups, when revised.
            ("localisation", pa.string()),
            ("stack_groups", pa.list_(_STACK_GROUP)),
            ("revised_at", _TS),
        ]
    ),
    "actions": pa.schema(
        [
            ("action_id", pa.string()),
            ("anomaly_id", pa.string()),
            ("decided_at", _TS),
            ("action", pa.string()),
            ("target", pa.string()),
            ("params", pa.map_(pa.string(), pa.string())),
            ("mode", pa.string()),
            ("status", pa.string()),
            ("reason", pa.string()),
            ("applied_at", _TS),
        ]
    ),
    "dead_letter": pa.schema(
        [
            ("received_at", _TS),
            ("ts", _TS),
            ("topic", pa.string()),
            ("partition", pa.int64()),
            ("offset", pa.int64()),
            ("reason", pa.string()),
            ("payload", pa.binary()),
        ]
    ),
}
_TIME_FIELDS = {"detected_at", "onset_ts", "decided_at", "applied_at", "received_at", "ts", "resolved_at", "revised_at"}
_DATE_FIELD = {"anomalies": "detected_at", "actions": "decided_at", "dead_letter": "received_at"}


def read_dataset(root: Path, dataset: str) -> pl.DataFrame:
    """One archive dataset as a frame, whatever version wrote each file (missing columns are null).

    Anomalies are published again when they resolve: this keeps one record per id (see
    :func:`detectors.lifecycle.latest_records`).
    """
    empty = pl.from_arrow(SCHEMAS[dataset].empty_table())
    assert isinstance(empty, pl.DataFrame)
    files = sorted((root / dataset).rglob("*.parquet")) if (root / dataset).is_dir() else []
    if not files:
        return empty
    frame = pl.concat([empty, *(pl.read_parquet(f) for f in files)], how="diagonal_relaxed")
    if dataset == "anomalies":
        frame = pl.from_dicts(latest_records(frame.to_dicts()), schema=frame.schema)
    return frame


def _row(dataset: str, item: Anomaly | Action | DeadLetter) -> dict[str, Any]:
    row = msgspec.structs.asdict(item)
    if dataset == "dead_letter":
        row["received_at"] = time.time()
    if dataset == "actions":
        row["params"] = list(row["params"].items())
    if dataset == "anomalies":
        row["stack_groups"] = [msgspec.structs.asdict(g) for g in row["stack_groups"]]
    for name in _TIME_FIELDS & row.keys():
        if row[name] is not None:
            row[name] = datetime.fromtimestamp(row[name], UTC)
    return row


def epoch_times(row: dict[str, Any]) -> dict[str, Any]:
    """``row`` (as read back from the archive) with its time columns as epoch seconds again."""
    for name in _TIME_FIELDS & row.keys():
        if row[name] is not None and hasattr(row[name], "timestamp"):
            row[name] = row[name].timestamp()
    return row


def anomaly_from_row(row: dict[str, Any]) -> Anomaly:
    """The :class:`Anomaly` an archived row was written from."""
    fields = set(Anomaly.__struct_fields__)
    values = {k: v for k, v in epoch_times(dict(row)).items() if k in fields and v is not None}
    if "stack_groups" in values:
        values["stack_groups"] = msgspec.convert(values["stack_groups"], list[StackGroup])
    return Anomaly(**values)


def write_atomically(table: pa.Table, path: Path) -> None:
    """Write ``table`` to ``path`` so that readers never see a partial file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        pq.write_table(table, tmp, compression="zstd")
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


_OPEN: weakref.WeakSet[_ArchivePartition] = weakref.WeakSet()


def flush_open_archives() -> None:
    """Write out what open archive writers buffer (after an interrupted run, whose sinks were not closed)."""
    for partition in list(_OPEN):
        partition.flush()


class _ArchivePartition(StatefulSinkPartition[Any, int]):
    def __init__(self, root: Path, dataset: str, worker: int, roll_rows: int, roll_s: float) -> None:
        self._dir = root / dataset
        self._dir.mkdir(parents=True, exist_ok=True)
        _OPEN.add(self)
        self._dataset = dataset
        self._schema = SCHEMAS[dataset]
        self._worker = worker
        self._roll_rows = roll_rows
        self._roll_s = roll_s
        self._rows: dict[str, list[dict[str, Any]]] = defaultdict(list)
        self._count = 0
        self._since = time.monotonic()
        self._seq = 0
        # A resumed run writes new files beside the old ones: a new stamp keeps the names apart.
        self._stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S") + f"-{uuid.uuid4().hex[:6]}"

    def write_batch(self, items: list[Any]) -> None:
        date_field = _DATE_FIELD[self._dataset]
        for item in items:
            row = _row(self._dataset, item)
            self._rows[row[date_field].strftime("%Y-%m-%d")].append(row)
            self._count += 1
        if self._count >= self._roll_rows or (self._count and time.monotonic() - self._since >= self._roll_s):
            self.flush()

    def flush(self) -> None:
        for date, rows in self._rows.items():
            table = pa.Table.from_pylist(rows, schema=self._schema)
            name = f"part-w{self._worker}-{self._stamp}-{self._seq:06d}.parquet"
            write_atomically(table, self._dir / f"date={date}" / name)
            self._seq += 1
        self._rows.clear()
        self._count = 0
        self._since = time.monotonic()

    def snapshot(self) -> int:
        # The epoch is closing: what it emitted must survive a crash before the next one.
        if self._count:
            self.flush()
        return self._seq

    def close(self) -> None:
        self.flush()


class ParquetArchiveSink(FixedPartitionedSink[Any, int]):
    """Archive one output dataset (``anomalies``, ``actions`` or ``dead_letter``).

    Items are ``(key, value)`` pairs (any key): one partition, so one writer per dataset.
    """

    def __init__(self, root: str | Path, dataset: str, roll_rows: int = 50_000, roll_s: float = 10.0) -> None:
        if dataset not in SCHEMAS:
            raise ValueError(f"unknown archive dataset {dataset!r}")
        self.root = Path(root)
        self.dataset = dataset
        self.roll_rows = roll_rows
        self.roll_s = roll_s

    def list_parts(self) -> list[str]:
        return [self.dataset]

    def part_fn(self, item_key: str) -> int:
        return 0

    def build_part(self, step_id: str, for_part: str, resume_state: int | None) -> _ArchivePartition:
        return _ArchivePartition(self.root, self.dataset, 0, self.roll_rows, self.roll_s)
