"""Read the timestamp and rank prefixes that launchers put on raw log lines.

Handles ``srun -l`` prefixes (``12: ``), PyTorch's ``[rank3]:`` and torchrun's
``[default3]:``, and the timestamps training logs carry: ISO-8601 (with ``T``
or a space, ``,`` or ``.`` fractions), glog ``[E1218 20:27:21.426]`` (PyTorch
drops the month's leading zero: ``[E410 ...]``) and syslog ``Dec  2 11:38:46``
(both without a year: pass one), and ``dmesg -T``
``[Wed Jul 31 23:14:18 2024]``. Times without a zone are taken as UTC.

>>> p = parse_prefix("3: [rank3]:[E1218 20:27:21.426 ProcessGroupNCCL.cpp:607] timeout", year=2024)
>>> p.rank, p.ts, p.text[:18]
(3, 1734553641.426, '[rank3]:[E1218 20:')
>>> parse_prefix("2024-11-04 11:41:27,602 - INFO - step 5").ts
1730720487.602
>>> parse_prefix("  what():  CUDA error").ts is None
True
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import NamedTuple


class Prefixed(NamedTuple):
    ts: float | None
    rank: int | None
    text: str  # the line without the srun rank prefix
    has_year: bool = True  # False: a glog/syslog stamp, given the year passed in


_SRUN = re.compile(r"^\s*(\d{1,6}): ")
_RANK = re.compile(r"\[(?:rank|default)(\d{1,6})\]:")
_ISO = re.compile(r"(\d{4}-\d{2}-\d{2})[T ](\d{2}:\d{2}:\d{2})(?:[.,](\d{1,9}))?(Z|[+-]\d{2}:?\d{2})?")
_GLOG = re.compile(r"\b[IWEF](\d{1,2})(\d{2}) (\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,9}))?")
_SYSLOG = re.compile(r"^([A-Z][a-z]{2}) {1,2}(\d{1,2}) (\d{2}):(\d{2}):(\d{2})\b")
_DMESG_T = re.compile(r"\[[A-Z][a-z]{2} ([A-Z][a-z]{2}) {1,2}(\d{1,2}) (\d{2}):(\d{2}):(\d{2}) (\d{4})\]")
_MONTHS = {
    m: i
    for i, m in enumerate(("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"), start=1)
}


def _frac(digits: str | None) -> float:
    return float("0." + digits) if digits else 0.0


def _stamp(year: int, month: int, day: int, h: int, mi: int, s: int, frac: float) -> float | None:
    try:
        return datetime(year, month, day, h, mi, s, tzinfo=UTC).timestamp() + frac
    except ValueError:
        return None


def find_timestamp(text: str, year: int) -> float | None:
    """Epoch seconds of the first timestamp in ``text``, or ``None``."""
    found = find_stamp(text, year)
    return None if found is None else found[0]


def find_stamp(text: str, year: int) -> tuple[float, bool] | None:
    """Epoch seconds of the first timestamp in ``text`` and whether it carries its own year
    (glog and syslog stamps do not: they get ``year``).

    >>> find_stamp("[E1218 20:27:21.426 ProcessGroupNCCL.cpp:607]", 2024)
    (1734553641.426, False)
    >>> find_stamp("[Wed Jul 31 23:14:18 2024] NVRM: Xid", 1999)
    (1722467658.0, True)
    """
    head = text[:160]
    m = _ISO.search(head)
    if m:
        zone = m[4] or "Z"
        try:
            dt = datetime.fromisoformat(f"{m[1]}T{m[2]}{zone}")
        except ValueError:
            return None
        return round(dt.timestamp() + _frac(m[3]), 6), True
    m = _DMESG_T.search(head)
    if m and m[1] in _MONTHS:
        ts = _stamp(int(m[6]), _MONTHS[m[1]], int(m[2]), int(m[3]), int(m[4]), int(m[5]), 0.0)
        return None if ts is None else (ts, True)
    m = _GLOG.search(head)
    if m:
        ts = _stamp(year, int(m[1]), int(m[2]), int(m[3]), int(m[4]), int(m[5]), _frac(m[6]))
        return None if ts is None else (round(ts, 6), False)
    m = _SYSLOG.search(head)
    if m and m[1] in _MONTHS:
        ts = _stamp(year, _MONTHS[m[1]], int(m[2]), int(m[3]), int(m[4]), int(m[5]), 0.0)
        return None if ts is None else (ts, False)
    return None


def parse_prefix(line: str, year: int | None = None) -> Prefixed:
    """Split a raw log line into its timestamp (if any), rank (if any) and text."""
    rank = None
    m = _SRUN.match(line)
    if m:
        rank = int(m[1])
        line = line[m.end() :]
    if rank is None:
        r = _RANK.search(line[:40])
        if r:
            rank = int(r[1])
    found = find_stamp(line, year or datetime.now(UTC).year)
    return Prefixed(None, rank, line) if found is None else Prefixed(found[0], rank, line, found[1])
