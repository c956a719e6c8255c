"""Which ranks of a hung job are the odd ones out, read from their Python stacks.

When a job hangs, its healthy ranks wait inside the same collective (``all_reduce`` →
``work.wait``); the culprit is elsewhere — in its data loader, in another collective,
stopped, or gone. So the ranks are grouped by what their stacks say, and a small group
against a dominant one is suspect:

- each process's stack is the thread that matters (the main thread, else the active one),
  with frames reduced to *function (file)*: no line numbers, no addresses, no ``runpy`` or
  ``<frozen …>`` shims, never the probe's own thread;
- processes group by that signature, and by their state: a stopped (``SIGSTOP``, a frozen
  cgroup) or missing process is not waiting like its peers, even where its stack is theirs;
- stopped or missing processes are outliers while they are a minority; among the others, with
  at least :data:`MIN_RANKS` of them, a group is an *outlier* when it holds at most a third of
  them and a *dominant* group — at least two ranks, more than half of them — exists;
- every rank in one group, or no dominant group: nobody is blamed, and the verdict says so.

Pure: it takes stacks records (typed or plain dicts, as ``collect-stacks`` publishes them).

>>> def rec(rank, *frames, state="sleeping"):
...     return {"ts": 0.0, "job_id": "7", "node": f"n{rank // 2}", "rank": rank, "state": state,
...             "threads": [{"name": "MainThread", "frames": [{"name": f, "filename": "/job/train.py"}
...                                                           for f in frames]}]}
>>> records = [rec(r, "all_reduce", "train_step", "main") for r in (0, 1, 3)]
>>> verdict = localise([*records, rec(2, "load_batch", "train_step", "main")])
>>> verdict.outlier_ranks, verdict.outlier_nodes
([2], ['n1'])
>>> for line in verdict.evidence():
...     print(line)
stacks: 3 ranks (0, 1, 3) in all_reduce ← train_step ← main
stacks: rank 2 (n1) in load_batch ← train_step ← main: outlier
>>> localise(records).verdict
'all 3 ranks in the same stack: nobody stands out'
>>> stopped = localise([*records, rec(2, "all_reduce", "train_step", "main", state="stopped")])
>>> stopped.outlier_ranks, stopped.groups[-1].state
([2], 'stopped')
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import msgspec

from trainguard.detectors.events import StackFrame, StackGroup, StacksRecord, ThreadStack

__all__ = ["MIN_RANKS", "ProcessStack", "StackVerdict", "frame_label", "group_lines", "localise", "process_stack"]

MIN_RANKS = 3  # fewer ranks than this cannot outvote one another
FRAMES_SHOWN = 6  # a group's representative stack, innermost first
WHERE_FRAMES = 3  # frames in a group's one-line description

# Threads that are never the one a rank is stuck in: the progress probe's sender.
_PROBE_THREADS = ("trainguard-probe",)
_PROBE_FILES = ("trainguard/probe/",)
# Interpreter shims around the program: the same in every rank, noise in a description.
_SHIM_FILES = ("runpy.py",)
# Where waiting ends up inside the standard library: a description names what waits, not how.
_WAIT_FILES = frozenset(
    {"threading.py", "queue.py", "selectors.py", "synchronize.py", "connection.py", "popen_fork.py"}
)
# Process states that are not merely waiting: collect-stacks reads them from /proc, says ``gone`` for a
# rank expected on the node that no process has; ``undumped``: py-spy could not read a live process.
ABNORMAL_STATES = frozenset({"stopped", "gone", "zombie", "undumped"})


def frame_label(frame: StackFrame) -> str:
    """A frame reduced to what identifies it across ranks: function and file name, nothing else.

    >>> frame_label(StackFrame(name="all_reduce", filename="/usr/lib/torch/distributed/distributed_c10d.py", line=9))
    'all_reduce (distributed_c10d.py)'
    """
    base = frame.filename.replace("\\", "/").rsplit("/", 1)[-1]
    return f"{frame.name} ({base})" if base else frame.name


def _kept(frame: StackFrame) -> bool:
    name = frame.filename
    return not (name.startswith("<frozen") or name.endswith(_SHIM_FILES) or any(p in name for p in _PROBE_FILES))


def _probe_thread(thread: ThreadStack) -> bool:
    return (thread.name or "") in _PROBE_THREADS or any(
        p in f.filename for f in thread.frames[:8] for p in _PROBE_FILES
    )


def main_thread(record: StacksRecord) -> ThreadStack | None:
    """The thread that matters: the main thread, else the active one, else the first with frames."""
    threads = [t for t in record.threads if t.frames and not _probe_thread(t)]
    for thread in threads:
        if thread.name == "MainThread" or (thread.tid is not None and thread.tid == record.pid):
            return thread
    return next((t for t in threads if t.active), threads[0] if threads else None)


@dataclass(frozen=True)
class ProcessStack:
    """One process reduced for grouping: who it is, its state and its stack's signature."""

    node: str
    rank: int | None
    pid: int | None
    state: str | None  # one of ABNORMAL_STATES, or None (running or waiting)
    frames: tuple[str, ...]  # frame labels, innermost first
    error: str | None = None

    @property
    def who(self) -> str:
        return f"rank {self.rank}" if self.rank is not None else f"pid {self.pid or '?'} on {self.node}"

    @property
    def signature(self) -> tuple[str | None, tuple[str, ...]]:
        return self.state, self.frames


def _state(record: StacksRecord) -> str | None:
    if record.state in ABNORMAL_STATES:
        return record.state
    if record.error and not record.threads:
        return "undumped"  # asked for and not read: whatever it does, it is not what its peers do
    return None


def process_stack(record: StacksRecord | Mapping[str, Any]) -> ProcessStack:
    """One stacks record (typed, or a plain dict as published) reduced to its signature."""
    rec = record if isinstance(record, StacksRecord) else msgspec.convert(record, StacksRecord, strict=False)
    thread = main_thread(rec)
    frames = tuple(frame_label(f) for f in thread.frames if _kept(f)) if thread is not None else ()
    return ProcessStack(rec.node, rec.rank, rec.pid, _state(rec), frames, rec.error)


def _where(frames: tuple[str, ...]) -> str:
    """A stack in a few words: the innermost frames that are not the standard library's waiting, nor
    decorators' wrappers (torch wraps every collective in ``_exception_logger.<locals>.wrapper``).

    >>> _where(("Event.wait (threading.py)", "all_reduce (distributed_c10d.py)",
    ...         "_exception_logger.<locals>.wrapper (c10d_logger.py)", "train_step (train.py)", "main (train.py)"))
    'all_reduce ← train_step ← main'
    """
    names = [label.split(" (")[0] for label in frames]
    files = [label.rsplit(" (", 1)[-1].rstrip(")") for label in frames]
    start = next((i for i, f in enumerate(files) if f not in _WAIT_FILES), 0)
    names = [name for name in names[start:] if not name.endswith("wrapper")]
    shown = names[:WHERE_FRAMES]
    return " ← ".join(shown) + (" …" if len(names) > WHERE_FRAMES else "") if shown else "no Python frames"


@dataclass
class StackVerdict:
    """The groups (largest first), the outliers among them, and the verdict in words."""

    groups: list[StackGroup]
    members: list[list[ProcessStack]]
    verdict: str
    outliers: list[ProcessStack] = field(default_factory=list)

    @property
    def outlier_ranks(self) -> list[int]:
        return sorted({p.rank for p in self.outliers if p.rank is not None})

    @property
    def outlier_nodes(self) -> list[str]:
        return sorted({p.node for p in self.outliers})

    def evidence(self, limit: int = 5) -> list[str]:
        """One line per group (``stacks: …``), outliers first after the dominant group."""
        lines = [f"stacks: {_describe(g, m)}" for g, m in zip(self.groups, self.members, strict=True)]
        if len(lines) > limit:
            rest = sum(len(m) for m in self.members[limit - 1 :])
            lines = [*lines[: limit - 1], f"stacks: {rest} more processes in {len(lines) - limit + 1} other stacks"]
        if not self.outliers:
            lines.append(f"stacks: {self.verdict}")
        return lines


def _describe(group: StackGroup, members: list[ProcessStack]) -> str:
    if len(members) == 1:
        p = members[0]
        who = f"{p.who} ({p.node})" if p.rank is not None else p.who
    else:
        ranks = [p.rank for p in members if p.rank is not None]
        who = f"{len(members)} ranks ({', '.join(map(str, ranks[:8]))}{', …' if len(ranks) > 8 else ''})"
    if group.state in ("gone", "undumped"):
        why = next((p.error for p in members if p.error), None)
        what = "process gone" if group.state == "gone" else "not dumped"
        text = f"{who}: {what}" + (f" ({why[:120]})" if why else "")
    else:
        text = f"{who} {group.state + ' ' if group.state else ''}in {group.where}"
    return text + (": outlier" if group.outlier else "")


def localise(records: Iterable[StacksRecord | Mapping[str, Any]]) -> StackVerdict:
    """Group the processes' stacks and name the outliers (see the module notes)."""
    stacks = [process_stack(r) for r in records]
    by_signature: dict[tuple[str | None, tuple[str, ...]], list[ProcessStack]] = {}
    for p in stacks:
        by_signature.setdefault(p.signature, []).append(p)
    # Largest first; ties in the order of their first rank, so every run names them alike.
    ordered = sorted(by_signature.values(), key=lambda m: (-len(m), _first(m)))
    n = len(stacks)
    outliers: set[int] = set()  # indexes into ordered
    abnormal = [i for i, m in enumerate(ordered) if m[0].state is not None]
    if abnormal and 2 * sum(len(ordered[i]) for i in abnormal) < n:
        outliers.update(abnormal)  # stopped or missing while most ranks are not: suspect whatever the stack
    # The ranks that are there and running (or waiting) outvote one another; a stopped one is explained already.
    normal = [i for i, m in enumerate(ordered) if m[0].state is None]
    voters = sum(len(ordered[i]) for i in normal)
    dominant = normal[0] if normal and len(ordered[normal[0]]) >= 2 and 2 * len(ordered[normal[0]]) > voters else None
    if voters >= MIN_RANKS and dominant is not None:
        outliers.update(i for i in normal if i != dominant and 3 * len(ordered[i]) <= voters)
    if not stacks:
        verdict = "no stacks"
    elif len(ordered) == 1:
        verdict = f"all {n} ranks in the same stack: nobody stands out"
    elif outliers:
        verdict = f"{sum(len(ordered[i]) for i in outliers)} of {n} ranks stand out"
    elif n < MIN_RANKS:
        verdict = f"{len(ordered)} different stacks among {n} ranks: too few ranks to name an outlier"
    else:
        verdict = f"no dominant stack among {n} ranks (largest group {len(ordered[0])}): nobody blamed"
    groups = [
        StackGroup(
            ranks=sorted(p.rank for p in m if p.rank is not None),
            nodes=sorted({p.node for p in m}),
            processes=len(m),
            where=_where(m[0].frames),
            frames=list(m[0].frames[:FRAMES_SHOWN]),
            state=m[0].state,
            outlier=i in outliers,
        )
        for i, m in enumerate(ordered)
    ]
    blamed = [p for i in sorted(outliers) for p in ordered[i]]
    return StackVerdict(groups, ordered, verdict, blamed)


def _first(members: list[ProcessStack]) -> tuple[int, str, int]:
    p = min(members, key=lambda p: (p.rank if p.rank is not None else 1 << 30, p.node, p.pid or 0))
    return (p.rank if p.rank is not None else 1 << 30, p.node, p.pid or 0)


def group_lines(groups: list[StackGroup], frames: int = 4) -> list[str]:
    """Stack groups for people (``explain``): one line per group, then its representative frames.

    >>> g = StackGroup(ranks=[2], nodes=["n1"], processes=1, where="load_batch ← main",
    ...                frames=["load_batch (train.py)", "main (train.py)"], outlier=True)
    >>> print("\\n".join(group_lines([g])))
    1 process in 1 group
    outlier: rank 2 on n1 in load_batch ← main
        load_batch (train.py)
        main (train.py)
    """
    total = sum(g.processes for g in groups)
    out = [f"{total} process{'es' if total != 1 else ''} in {len(groups)} group{'s' if len(groups) != 1 else ''}"]
    for g in groups:
        who = f"rank {g.ranks[0]}" if len(g.ranks) == 1 and g.processes == 1 else f"{g.processes} processes"
        if len(g.ranks) > 1:
            who += f" (ranks {', '.join(map(str, g.ranks[:16]))}{', …' if len(g.ranks) > 16 else ''})"
        state = f" {g.state}" if g.state else ""
        out.append(f"{'outlier: ' if g.outlier else ''}{who} on {', '.join(g.nodes[:8])}{state} in {g.where}")
        out += [f"    {frame}" for frame in g.frames[:frames]]
    return out
