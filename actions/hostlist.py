"""Slurm hostlist expressions, expanded without calling ``scontrol show hostnames``.

>>> expand("gpu-node-[01-04,07]")
['gpu-node-01', 'gpu-node-02', 'gpu-node-03', 'gpu-node-04', 'gpu-node-07']
>>> expand("a[1-2]-b[8-9],login")
['a1-b8', 'a1-b9', 'a2-b8', 'a2-b9', 'login']
>>> expand("")
[]
"""

from __future__ import annotations

import re

_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")
MAX_HOSTS = 100_000  # a typo like [1-99999999] must not eat the memory


class HostlistError(ValueError):
    """A hostlist expression that Slurm would not accept."""


def _split_top_level(text: str) -> list[str]:
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise HostlistError(f"unbalanced ']' in hostlist {text!r}")
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    if depth:
        raise HostlistError(f"unbalanced '[' in hostlist {text!r}")
    parts.append(text[start:])
    return [p for p in parts if p]


def _expand_one(pattern: str) -> list[str]:
    open_at = pattern.find("[")
    if open_at < 0:
        return [pattern]
    close_at = pattern.index("]", open_at)
    head, body, tail = pattern[:open_at], pattern[open_at + 1 : close_at], pattern[close_at + 1 :]
    values: list[str] = []
    for piece in body.split(","):
        m = _RANGE.match(piece.strip())
        if not m:
            raise HostlistError(f"bad range {piece!r} in hostlist {pattern!r}")
        lo, hi = m.group(1), m.group(2) or m.group(1)
        if int(hi) < int(lo) or int(hi) - int(lo) > MAX_HOSTS:
            raise HostlistError(f"bad range {piece!r} in hostlist {pattern!r}")
        width = len(lo)  # Slurm keeps the zero padding of the lower bound
        values.extend(str(n).zfill(width) for n in range(int(lo), int(hi) + 1))
    return [head + v + rest for v in values for rest in _expand_one(tail)]


def expand(hostlist: str) -> list[str]:
    """Every host name in a Slurm hostlist expression, in order."""
    hosts: list[str] = []
    for part in _split_top_level(hostlist.strip()):
        hosts.extend(_expand_one(part))
        if len(hosts) > MAX_HOSTS:
            raise HostlistError(f"hostlist {hostlist[:60]!r} names more than {MAX_HOSTS} hosts")
    return hosts
