"""What one log line of a job says, read once: progress, a phase boundary, a rhythm, an NVRx score, a fault
(and, for a line that says nothing alone, whether it continues the line before: :func:`rejoin_wrapped`).

A job monitor turns this reading into calls on its detectors; reading and reacting are
kept apart so each can be tested alone, and so the order in which a line is tried is
decided in one place: progress first (the common case), then the signature catalogue,
and phases and rhythms last, because a failure may name a phase or an interval.

>>> read_line("iteration      120/  100000 | elapsed time per iteration (ms): 812.5 | lm loss: 2.1E+00 |")
Progress(parsed=ParsedProgress(step=120, step_time_s=0.8125, tokens_per_s=None, samples_per_s=None), match=None)
>>> read_line("[default0]: saving checkpoint at iteration 400")
PhaseMarker(starts=True)
>>> type(read_line("RuntimeError: CUDA error: an illegal memory access was encountered")).__name__
'Matched'
>>> type(read_line("./train.sh: line 9: 2324 Aborted  (core dumped) python train.py --save_interval 500")).__name__
'Matched'
>>> read_line("W1204 17:52:13.506000 5374 torch/distributed/elastic/agent/server/api.py:753] "
...           "Received 15 death signal, shutting down workers").how
'Received 15 death signal, shutting down workers'
>>> read_line("hello")
Unmatched()
"""

from __future__ import annotations

import re
from collections.abc import Callable
from functools import partial
from typing import NamedTuple

import msgspec

from trainguard.detectors.events import LogRecord
from trainguard.detectors.hang import parse_rhythm
from trainguard.detectors.literals import shape
from trainguard.detectors.phases import phase_marker
from trainguard.detectors.progress_parsers import (
    ParsedProgress,
    RankScore,
    parse_nvrx_score,
    parse_progress,
    progress_reader,
)
from trainguard.detectors.signatures import (
    MAX_MATCHED_CHARS,
    SignatureMatch,
    looks_fatal,
    match_line,
    never_matches,
    shape_memo,
    strip_envelope,
)

_RHYTHM_HINTS = ("_interval", "_steps", "every", "val_check", ".interval", ".freq")
# torchtitan's validator reports its result as a metrics line (torchtitan/components/metrics.py, "validate step:
# N  loss: ..."): the evaluation that began after step N (it prints no start) is over.
_VALIDATION_DONE = "validate step:"
# A wrapped line: terminals wrap at 80 columns or more, and both halves arrive together.
WRAP_MIN_CHARS = 64
WRAP_MAX_GAP_S = 1.0
# How a new log record starts (so it is no continuation): NCCL's host:pid:tid [dev], a stamp, a level.
_RECORD_HEADER = re.compile(
    r"\S+:\d+:\d+ \[\d+\]|\[?\d{4}-\d\d-\d\d|\[?[IWEF]\d{3,4} |\[?[A-Z][a-z]{2} [ \d]\d |\[\s*\d+\.\d+\]|"
    r"\[?(?:INFO|WARNING|WARN|ERROR|DEBUG|CRITICAL|FATAL)\b|\w+ \d{1,2} \d\d:\d\d:\d\d"
)


class Progress(NamedTuple):
    """A progress line; ``match``: a fault printed on the same line (a NaN loss, text after a progress bar)."""

    parsed: ParsedProgress
    match: SignatureMatch | None


class NvrxScore(NamedTuple):
    """One rank's line of NVRx's straggler report."""

    score: RankScore


class NvrxSection(NamedTuple):
    """The heading of an NVRx report section: ``relative`` or ``individual`` scores follow."""

    name: str


class PhaseMarker(NamedTuple):
    """A benign phase (checkpoint, evaluation) starts or ends."""

    starts: bool


class Rhythm(NamedTuple):
    """An interval the job printed (``eval_interval ... 1000``)."""

    name: str
    every: int


class Matched(NamedTuple):
    """A line the signature catalogue explains."""

    match: SignatureMatch


class Unmatched(NamedTuple):
    """Anything else (it may still look fatal: the crash detector decides)."""


class Stopped(NamedTuple):
    """The job was told to stop from outside (``scancel``, a pod deleted, Ctrl-C): its end, not a fault —
    unless something had already failed (then it is that failure's aftermath: ``match``, the catalogue's
    reading of the line, if any, tells it).

    ``how``: the line's own words for it.
    """

    how: str
    match: SignatureMatch | None


_new_progress = partial(tuple.__new__, Progress)  # (NamedTuple's own __new__ takes twice as long)

LineReading = Progress | NvrxScore | NvrxSection | PhaseMarker | Rhythm | Matched | Unmatched | Stopped

# A launcher or scheduler saying the job is being stopped on request. torchelastic's agent on SIGTERM or
# SIGINT (torch/distributed/elastic/agent/server/api.py: "Received {sig} death signal, shutting down
# workers"; multiprocessing/api.py: "Process {pid} got signal: {sig}") — not SIGHUP: a session that hung
# up under a job nobody meant to stop is a failure (nohup missing) — and Slurm's user cancel
# (slurmstepd: "*** JOB 1234 ON node01 CANCELLED AT 2026-12-01T10:00:00 ***"; a cancel DUE TO a time limit
# or preemption is the catalogue's job_cancelled).
_STOPPED = re.compile(
    r"Received (?:15|2|Signals\.SIG(?:TERM|INT)) death signal, shutting down workers|"
    r"SignalException: Process \d+ got signal: (?:15|2)\b|"
    r"\*\*\* (?:JOB|STEP) \S+ ON \S+ CANCELLED AT \S+ \*\*\*"
)
_STOP_SIGNATURES = frozenset({"launcher_killed", "python_exception"})


# Shapes of step lines that read as progress and nothing else, whatever their numbers -> how to read one.
_STEP_SHAPES: dict[bytes, Callable[[str], ParsedProgress]] = shape_memo()
_MAX_STEP_SHAPES = 4096


def read_line(line: str) -> LineReading:
    """Read one log line of a job."""
    # Its shape once, for both readings (a line over MAX_MATCHED_CHARS is matched on a clip of it).
    line_shape = shape(line) if len(line) <= MAX_MATCHED_CHARS else None
    if line_shape is not None:
        read = _STEP_SHAPES.get(line_shape)
        if read is not None:  # a framework's step line, printed again with other numbers: read by slicing
            return _new_progress((read(line), None))
    parsed = parse_progress(line, line_shape=line_shape)
    if parsed is not None and _VALIDATION_DONE in line:
        return PhaseMarker(starts=False)
    if parsed is not None:
        fault = match_line(line, line_shape=line_shape)
        if fault is None and "\r" in line:  # a progress bar's redraws, then what the terminal shows last
            fault = match_line(line.rsplit("\r", 1)[1])
        elif fault is None and line_shape is not None:
            _remember_step_shape(line, line_shape)
        return Progress(parsed, fault)
    score = parse_nvrx_score(line)
    if score is not None:
        return NvrxScore(score)
    if "performance:" in line and "NVRx" in line:
        return NvrxSection("individual" if "individual" in line else "relative")
    match = match_line(line, line_shape=line_shape)
    if (match is None and "CANCELLED AT" in line) or (match is not None and match.signature.id in _STOP_SIGNATURES):
        stopped = _STOPPED.search(line)
        if stopped is not None:
            return Stopped(stopped[0], match)
    if match is not None:
        return Matched(match)
    # A failure that names a phase or an interval ("FATAL: could not finish saving checkpoint",
    # "Aborted ... --save_interval 500") is a failure, not a phase boundary; asked only of the few lines
    # that name one, so ordinary lines pay nothing for it.
    marker = phase_marker(line)
    if marker is not None:
        return Unmatched() if looks_fatal(line) else PhaseMarker(marker[1])
    if any(hint in line for hint in _RHYTHM_HINTS):
        rhythm = parse_rhythm(line)
        if rhythm is not None:
            return Unmatched() if looks_fatal(line) else Rhythm(*rhythm)
    return Unmatched()


def _remember_step_shape(line: str, line_shape: bytes) -> None:
    """Read the next lines of ``line``'s shape by slicing, when their reading cannot depend on their digits:
    progress read by slicing (:func:`progress_reader`), and no signature that could match any of them.
    (No carriage return: it was checked, and the shape keeps it.)"""
    read = progress_reader(line, line_shape)
    if read is not None and never_matches(line, line_shape):
        if len(_STEP_SHAPES) >= _MAX_STEP_SHAPES:
            _STEP_SHAPES.clear()
        _STEP_SHAPES[line_shape] = read


def rejoin_wrapped(tail: LogRecord, rec: LogRecord) -> tuple[LogRecord, SignatureMatch] | None:
    """A message a terminal wrapped onto two lines ("... Resource exhausted: Out " / "of memory while
    trying to allocate"), read whole.

    ``tail`` is the job's line just before ``rec``, long and unmatched; they are joined only when they
    come from the same node and rank at the same moment and ``rec`` reads as a continuation: no record
    header of its own (a stamp, a level, NCCL's ``host:pid:tid [dev]``), and either ``tail`` ends in a
    space or ``rec`` starts in lower case.

    >>> head = LogRecord(ts=1.0, node="n1", line="E local_client.cc:672] Execution of replica 0 failed: "
    ...                  "Resource exhausted: Out ")
    >>> joined, fault = rejoin_wrapped(head, LogRecord(ts=1.0, node="n1", line="of memory while trying to allocate"))
    >>> fault.signature.category, joined.line[-38:]
    ('oom', 'Out of memory while trying to allocate')
    """
    if tail.node != rec.node or tail.rank != rec.rank or abs(rec.ts - tail.ts) > WRAP_MAX_GAP_S:  # type: ignore[operator]
        return None
    rest = strip_envelope(rec.line)  # a launcher prefixes each line it relays, continuations too
    if not rest or not (tail.line.endswith(" ") or rest[0].islower()) or _RECORD_HEADER.match(rest):
        return None
    joined = msgspec.structs.replace(rec, line=tail.line + rest)
    fault = match_line(joined.line)
    return None if fault is None else (joined, fault)
