"""Import plain-text training logs (Slurm ``slurm-<job>.out`` files and the like) as log records.

Lines without a timestamp (tracebacks, continuation lines) take the timestamp
of the line before them; lines before the first timestamp take the first one.
A file with no readable timestamp at all is refused with one sentence.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import msgspec

from trainguard.detectors.logprefix import parse_prefix

_SLURM_OUT = re.compile(r"slurm-(\d+)(?:_\d+)?\.out$")
_KERNEL = re.compile(r"NVRM:|kernel:|SXid|nvidia-nvswitch")


class LogImportError(ValueError):
    """A log file cannot be imported; one sentence says why."""


def job_from_path(path: Path) -> str | None:
    m = _SLURM_OUT.search(path.name)
    return m[1] if m else None


def import_lines(
    lines: list[str],
    *,
    job_id: str | None = None,
    node: str = "unknown",
    year: int | None = None,
    start: float | None = None,
    interval: float = 1.0,
) -> list[dict[str, Any]]:
    """Log records (wire-contract dicts) for the non-empty ``lines`` of one log.

    With ``start``, the lines are stamped ``start``, ``start + interval``, … in order
    and the stamps they carry are ignored (a log with none can still be imported).

    >>> [(r["ts"], r["rank"], r["source"]) for r in import_lines(
    ...     ["3: step 1", "NVRM: Xid (PCI:0000:3b:00): 79"], start=100.0, interval=0.5)]
    [(100.0, 3, 'app'), (100.5, None, 'kernel')]
    """
    parsed = [parse_prefix(line.rstrip("\r\n"), year) for line in lines if line.strip()]
    if start is not None:
        stamps: list[float | None] = [start + i * interval for i in range(len(parsed))]
    else:
        stamps = [p.ts for p in parsed]
    first = next((ts for ts in stamps if ts is not None), None)
    if first is None:
        return []
    ts = first
    records = []
    for p, stamp in zip(parsed, stamps, strict=True):
        ts = stamp if stamp is not None else ts
        records.append(
            {
                "ts": ts,
                "job_id": job_id,
                "node": node,
                "rank": p.rank,
                "source": "kernel" if _KERNEL.search(p.text) else "app",
                "line": p.text,
            }
        )
    return records


def import_log(
    path: Path, *, job_id: str | None = None, node: str = "unknown", year: int | None = None
) -> Iterator[dict[str, Any]]:
    """Log records (wire-contract dicts) for every non-empty line of ``path``."""
    if not path.is_file():
        raise LogImportError(f"log file {path} does not exist.")
    job = job_id or job_from_path(path)
    year = year or datetime.fromtimestamp(path.stat().st_mtime, UTC).year
    with path.open("r", encoding="utf-8", errors="replace") as fh:
        records = import_lines(fh.readlines(), job_id=job, node=node, year=year)
    if not records:
        raise LogImportError(
            f"{path} has no line with a timestamp I can read (ISO-8601, glog [E1218 20:27:21.426], "
            "syslog 'Dec  2 11:38:46' or dmesg -T '[Wed Jul 31 23:14:18 2024]'); add timestamps to the log."
        )
    yield from records


def import_logs(paths: list[Path], out_dir: Path, **kwargs: Any) -> tuple[Path, int]:
    """Write ``out_dir/logs.jsonl`` from ``paths``, merged by time; returns the path and record count."""
    records = [rec for path in paths for rec in import_log(path, **kwargs)]
    records.sort(key=lambda r: r["ts"])  # stable: keeps each file's line order among equal stamps
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / "logs.jsonl"
    enc = msgspec.json.Encoder()
    with target.open("wb") as fh:
        fh.writelines(enc.encode(r) + b"\n" for r in records)
    return target, len(records)
