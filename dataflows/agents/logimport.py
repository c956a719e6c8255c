"""Import plain-text training logs (Slurm ``slurm-<job>.out`` files and the like) as log records.

Lines without a timestamp (tracebacks, continuation lines) take the timestamp
of the line before them; lines before the first timestamp take the first one.
Stamps without a year take the year of the nearest stamp in the file that has one.
A file with no readable timestamp at all is refused with one sentence, unless
``start``/``interval`` stamp its lines in order.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import msgspec

from trainguard.detectors.logprefix import Prefixed, find_stamp, parse_prefix

_SLURM_OUT = re.compile(r"slurm-(\d+)(?:_\d+)?\.out$")
_KERNEL = re.compile(r"NVRM:|kernel:|SXid|nvidia-nvswitch")
_DAY = 86_400.0
# Where a log names its node. Names are checked again (strict pattern, scheduler inventory)
# before anything acts on them; they never reach a shell.
_NODE = r"(?P<node>[A-Za-z0-9][A-Za-z0-9._-]{0,62})"
_NODE_PATTERNS = (
    re.compile(r"^\s*host\s*:\s*" + _NODE + r"\s*$"),  # torchelastic's failure block
    re.compile(r"\bSLURMD_NODENAME\s*[=:]\s*['\"]?" + _NODE),
    re.compile(r"^[A-Z][a-z]{2} {1,2}\d{1,2} \d\d:\d\d:\d\d " + _NODE + r" \S+?(?:\[\d+\])?: "),  # syslog
    re.compile(r"^\d{4}-\d\d-\d\dT\S+ " + _NODE + r" \S+?(?:\[\d+\])?: "),  # journalctl -o short-iso
)


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
    fallback_year: int | None = None,
    warnings: list[str] | None = None,
) -> list[dict[str, Any]]:
    """Log records (wire-contract dicts) for the non-empty ``lines`` of one log.

    With ``start``, the lines are stamped ``start``, ``start + interval``, … in order
    and the stamps they carry are ignored (a log with none can still be imported).

    >>> [(r["ts"], r["rank"], r["source"]) for r in import_lines(
    ...     ["3: step 1", "NVRM: Xid (PCI:0000:3b:00): 79"], start=100.0, interval=0.5)]
    [(100.0, 3, 'app'), (100.5, None, 'kernel')]

    Stamps without a year (glog ``[E0731 …]``, syslog) take ``year`` when it is given, else
    the year of the nearest stamp in the log that has one (as lnav does), else ``fallback_year``:

    >>> from datetime import datetime, UTC
    >>> recs = import_lines(["[Wed Jul 31 23:14:18 2024] NVRM: Xid 79", "[E0731 23:14:20.1 x.cpp:1] timeout"],
    ...                     fallback_year=2026)
    >>> [datetime.fromtimestamp(r["ts"], UTC).year for r in recs]
    [2024, 2024]
    """
    texts = [line.rstrip("\r\n") for line in lines if line.strip()]
    provisional = year or fallback_year or datetime.now(UTC).year
    parsed = [parse_prefix(text, provisional) for text in texts]
    if start is not None:
        stamps: list[float | None] = [start + i * interval for i in range(len(parsed))]
    else:
        stamps = [p.ts for p in parsed]
        if year is None:
            stamps = _infer_years(parsed, stamps, warnings)
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


def _infer_years(parsed: list[Prefixed], stamps: list[float | None], warnings: list[str] | None) -> list[float | None]:
    """Give each yearless stamp the year that puts it nearest the closest full stamp in the log."""
    full = [i for i, p in enumerate(parsed) if p.ts is not None and p.has_year]
    if not full:
        return stamps
    out = list(stamps)
    far = 0
    for i, p in enumerate(parsed):
        if p.ts is None or p.has_year:
            continue
        j = min(full, key=lambda k: abs(k - i))
        anchor: float = parsed[j].ts  # type: ignore[assignment]
        around = datetime.fromtimestamp(anchor, UTC).year
        candidates = [found[0] for y in (around - 1, around, around + 1) if (found := find_stamp(p.text, y))]
        if candidates:
            out[i] = min(candidates, key=lambda c: abs(c - anchor))
            far += abs(out[i] - anchor) > _DAY  # type: ignore[operator]
    if far and warnings is not None:
        warnings.append(
            f"{far} line(s) without a year are more than a day from the nearest stamp that has one; "
            "check them, or pass --year."
        )
    return out


def detect_node(lines: list[str]) -> str | None:
    """The node a log came from, when it says so (torchelastic's ``host :``, ``SLURMD_NODENAME``,
    a syslog host field); the name seen most often.

    >>> detect_node(["  host      : gpu-node-07", "Dec  2 11:38:46 gpu-node-07 kernel: NVRM: Xid 79"])
    'gpu-node-07'
    >>> detect_node(["step 1 loss 2.0"]) is None
    True
    """
    names = Counter(m["node"] for line in lines for pattern in _NODE_PATTERNS if (m := pattern.search(line[:200])))
    return names.most_common(1)[0][0] if names else None


def import_log(
    path: Path,
    *,
    job_id: str | None = None,
    node: str | None = None,
    year: int | None = None,
    start: float | None = None,
    interval: float = 1.0,
    warnings: list[str] | None = None,
) -> Iterator[dict[str, Any]]:
    """Log records (wire-contract dicts) for every non-empty line of ``path``.

    ``node`` defaults to the one the log names (:func:`detect_node`), else ``unknown``.
    """
    if not path.is_file():
        raise LogImportError(f"log file {path} does not exist.")
    job = job_id or job_from_path(path)
    with path.open("r", encoding="utf-8", errors="replace") as fh:
        lines = fh.readlines()
    if node is None:
        node = detect_node(lines)
        if node is None:
            node = "unknown"
            if warnings is not None:
                warnings.append(f"{path.name} does not name its node; its records say 'unknown' (pass --node).")
    records = import_lines(
        lines,
        job_id=job,
        node=node,
        year=year,
        start=start,
        interval=interval,
        fallback_year=datetime.fromtimestamp(path.stat().st_mtime, UTC).year,
        warnings=warnings,
    )
    if not records:
        raise LogImportError(
            f"{path} has no line with a timestamp I can read (ISO-8601, glog [E1218 20:27:21.426], "
            "syslog 'Dec  2 11:38:46' or dmesg -T '[Wed Jul 31 23:14:18 2024]'); "
            "pass --start TIME --interval SECONDS to stamp its lines in order."
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
