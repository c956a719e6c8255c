"""Lenient reading of optional fields: one odd field never costs a whole record.

Exporters differ: NVML reports pending row remaps as a flag and many exporters send
booleans, text-first ones send numbers as strings, and a sensor that cannot be read
comes as ``"NaN"``. When the strict decoder refuses a record, it is read again here:
every optional metric field is coerced where the meaning is clear (a boolean as
0/1, a numeric string as its number, NaN/Inf as null) or nulled, and each such
field is counted (:data:`FIELD_WARNINGS`: Prometheus ``trainguard_field_warnings_total``
and the run summary). Only unusable *required* fields (``ts``, ``node``, the job and
rank of a progress record, …) still send the record to the dead-letter sink.

>>> fields, notes = coerce({"util_pct": "97.5", "remapped_rows_pending": True, "power_w": "NaN"},
...                        {"util_pct": float, "remapped_rows_pending": int, "power_w": float})
>>> fields, sorted(notes)
({'util_pct': 97.5, 'remapped_rows_pending': 1, 'power_w': None}, ['power_w', 'remapped_rows_pending', 'util_pct'])
"""

from __future__ import annotations

import json
import math
from collections import Counter
from typing import Any

FIELD_WARNINGS: Counter[tuple[str, str]] = Counter()  # (topic, field) -> records coerced or nulled

_TRUE = frozenset({"true", "yes", "on"})
_FALSE = frozenset({"false", "no", "off", ""})


def _number(value: Any, kind: type) -> tuple[Any, bool]:
    """``(coerced value, clean)``: the value as ``kind`` (int or float), or None when it has no clear meaning."""
    if value is None:
        return None, True
    if isinstance(value, bool):
        return int(value), False
    if isinstance(value, int | float):
        if isinstance(value, float) and not math.isfinite(value):
            return None, False
        if kind is int:  # an integer as such is clean; 3.0 is read as 3, and counted
            return (int(value), type(value) is int) if float(value).is_integer() else (None, False)
        return float(value), isinstance(value, float)
    if isinstance(value, str):
        text = value.strip().lower()
        if text in _TRUE:
            return 1, False
        if text in _FALSE:
            return (0 if kind is int else None), False
        try:
            number = float(text)
        except ValueError:
            return None, False
        return _number(number, kind)[0], False
    return None, False


def _flag(value: Any) -> tuple[bool, bool]:
    """``(flag, clean)``: an optional boolean read leniently; anything unclear (null included) is False."""
    if isinstance(value, bool):
        return value, True
    if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
        return value.strip().lower() in _TRUE, False
    if isinstance(value, int | float) and value in (0, 1):
        return bool(value), False
    return False, False


def coerce(record: dict[str, Any], optional: dict[str, type]) -> tuple[dict[str, Any], list[str]]:
    """``record`` with its ``optional`` numeric (and boolean) fields coerced; the names of fields that were not clean.

    >>> coerce({"beat": "yes", "pid": "4242"}, {"beat": bool, "pid": int})
    ({'beat': True, 'pid': 4242}, ['beat', 'pid'])
    """
    out = dict(record)
    notes = []
    for name, kind in optional.items():
        if name not in out:
            continue
        value, clean = _flag(out[name]) if kind is bool else _number(out[name], kind)
        out[name] = value
        if not clean and not (kind is float and isinstance(record[name], int) and not isinstance(record[name], bool)):
            notes.append(name)
    return out, notes


def parse_loose(raw: bytes) -> Any:
    """JSON as exporters write it, ``NaN`` and ``Infinity`` literals included (the stdlib accepts them)."""
    return json.loads(raw)
