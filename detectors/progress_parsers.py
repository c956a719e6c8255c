"""Turn training-framework log lines into progress observations.

Only rank 0 (or the last rank) usually prints iteration lines, so these parsed
observations are job-level: they say the job as a whole made a step. Formats:
Megatron-LM / Megatron-DeepSpeed, torchtitan, DeepSpeed (engine and timer lines),
tqdm bars as printed by HF Trainer, PyTorch Lightning and NeMo, HF Trainer's
metric dicts, MMCV/MMDetection and BasicSR loggers, and JSON metric lines.
``step`` is ``None`` when a line proves progress but carries no step number
(HF Trainer's ``{'loss': ...}`` dicts); the monitor counts those itself. A NaN/Inf
loss in a progress line is the signature catalogue's to find (the monitor matches
progress lines too).

>>> parse_progress("iteration      120/  500000 | consumed samples: 7680 | "
...                "elapsed time per iteration (ms): 4247.9 | learning rate: 1.0E-04 |")
ParsedProgress(step=120, step_time_s=4.2479, tokens_per_s=None, samples_per_s=None)
>>> parse_progress("step: 40  loss:  7.1234  memory: 30.1GiB(40.2%)  tps: 5,320  mfu: 30.2%").tokens_per_s
5320.0
>>> round(parse_progress(" 12%|█▏        | 60/500 [00:43<05:16,  1.39it/s]").step_time_s, 3)
0.719
>>> parse_progress("Saving checkpoint") is None
True
"""

from __future__ import annotations

import re
from collections.abc import Callable
from functools import partial
from typing import NamedTuple

import msgspec

from trainguard.detectors.literals import ShapedPattern


class ParsedProgress(NamedTuple):
    step: int | None
    step_time_s: float | None = None
    tokens_per_s: float | None = None
    samples_per_s: float | None = None


class RankScore(NamedTuple):
    """One line of an NVRx straggler report: a rank's performance score (1.0 = fastest)."""

    rank: int
    node: str
    score: float


_NUM = r"[-+]?\d[\d,]*\.?\d*(?:[eE][-+]?\d+)?"
_ANSI = re.compile(r"\x1b\[[0-9;]*m")

# The step lines frameworks print for hours in one shape, only their numbers changing, are read by slicing
# where their pattern matched the first line of that shape (see ShapedPattern); the groups by number.
_MEGATRON = ShapedPattern(
    r"iteration\s+(\d+)\s*/\s*\d+\s*\|.*?elapsed time per iteration \((ms|s)\):\s*"  # step, unit
    rf"({_NUM})"  # elapsed
)
_MEGATRON_SPS = ShapedPattern(rf"samples per second:\s*({_NUM})")
_TORCHTITAN = ShapedPattern(rf"\bstep:\s*(\d+)\b.*?\btps:\s*({_NUM})")  # step, tokens per second
_DS_TIMER = re.compile(
    rf"(?:global_step=(?P<gstep>\d+).*?CurrSamplesPerSec=(?P<cur>{_NUM}))|"
    rf"(?:\]\s*\d+/(?P<step>\d+),\s*SamplesPerSec=(?P<sps>{_NUM}))"
)
_DS_STEPS = re.compile(rf"\bsteps?[:=]\s*(?P<step>\d+)\b.*?samples/sec[=:]\s*(?P<sps>{_NUM})")
_TQDM = re.compile(
    rf"\|\s*(?P<step>\d+)/(?P<total>\d+|\?)\s*\[[\d:]+<[\d:?]+,\s*(?P<rate>{_NUM})(?P<unit>it/s|s/it)"
    r"(?P<postfix>[^\]]*)\]"
)
_GLOBAL_STEP = re.compile(rf"global_step[=:]\s*(?P<gs>{_NUM})")
_MMCV = re.compile(r"Epoch \[(?P<epoch>\d+)\]\[(?P<it>\d+)/(?P<total>\d+)\].*?\btime: (?P<time>[\d.]+)")
_BASICSR = re.compile(r"<epoch:\s*\d+, iter:\s*(?P<it>[\d,]+),")
_HF_DICT = re.compile(r"\{'(?:loss|train_loss|eval_loss)': ")
_NVRX = re.compile(r"Rank=(?P<rank>\d+)\s+Node=(?P<node>\S+)\s+Score=(?P<score>[\d.]+)")


class _JsonMetrics(msgspec.Struct):
    step: int | None = None
    iteration: int | None = None
    global_step: int | None = None
    step_time_s: float | None = None
    tokens_per_s: float | None = None
    samples_per_s: float | None = None


_JSON = msgspec.json.Decoder(_JsonMetrics)


def _num(text: str) -> float:
    return float(text.replace(",", ""))


def parse_progress(line: str, *, line_shape: bytes | None = None) -> ParsedProgress | None:
    """A progress observation from one log line, or ``None`` when it holds none. ``line_shape``: the line's
    :func:`~trainguard.detectors.literals.shape`, when the caller has it."""
    if "\x1b" in line:
        line = _ANSI.sub("", line)
        line_shape = None
    return _parse(line, line_shape)


def progress_reader(line: str, line_shape: bytes) -> Callable[[str], ParsedProgress] | None:
    """How :func:`parse_progress` reads every line of ``line``'s shape, when slicing it where ``line`` matched
    is all it does (Megatron's and torchtitan's step lines): ``reader(other)`` is ``parse_progress(other)``
    for any ``other`` of that shape. ``None`` for other lines.

    >>> from trainguard.detectors.literals import shape
    >>> line = "iteration 12/ 50 | elapsed time per iteration (ms): 812.5 |"
    >>> reader = progress_reader(line, shape(line))
    >>> reader("iteration 13/ 50 | elapsed time per iteration (ms): 790.0 |")
    ParsedProgress(step=13, step_time_s=0.79, tokens_per_s=None, samples_per_s=None)
    """
    return None if "\x1b" in line else _sliced(line, line_shape)


# NamedTuple's generated __new__ takes twice as long as the tuple's own: the step lines' hot path builds them so.
_new_parsed = partial(tuple.__new__, ParsedProgress)


def _megatron(step: slice, elapsed: slice, divisor: float, sps: slice | None, line: str) -> ParsedProgress:
    # (A time in seconds is divided by 1.0: exact, like not dividing it.)
    return _new_parsed((int(line[step]), _num(line[elapsed]) / divisor, None, None if sps is None else _num(line[sps])))


def _torchtitan(step: slice, tps: slice, line: str) -> ParsedProgress:
    return _new_parsed((int(line[step]), None, _num(line[tps]), None))


def _sliced(line: str, line_shape: bytes | None) -> Callable[[str], ParsedProgress] | None:
    """The reading of a step line of the formats read by slicing, tried first: Megatron's, torchtitan's."""
    if "elapsed time per iteration" in line:
        at = _MEGATRON.spans(line, line_shape)
        if at is not None:
            (_, step, unit, elapsed), sps = at, _MEGATRON_SPS.spans(line, line_shape)
            divisor = 1000.0 if line[unit[0] : unit[1]] == "ms" else 1.0
            return partial(_megatron, slice(*step), slice(*elapsed), divisor, None if sps is None else slice(*sps[1]))
    if "tps:" in line:
        at = _TORCHTITAN.spans(line, line_shape)
        if at is not None:
            return partial(_torchtitan, slice(*at[1]), slice(*at[2]))
    return None


def _parse(line: str, line_shape: bytes | None) -> ParsedProgress | None:
    read = _sliced(line, line_shape)
    if read is not None:
        return read(line)
    if "SamplesPerSec" in line:
        m = _DS_TIMER.search(line)
        if m:
            if m["gstep"]:
                return ParsedProgress(step=int(m["gstep"]), samples_per_s=_num(m["cur"]))
            return ParsedProgress(step=int(m["step"]), samples_per_s=_num(m["sps"]))
    if "samples/sec" in line:
        m = _DS_STEPS.search(line)
        if m:
            return ParsedProgress(step=int(m["step"]), samples_per_s=_num(m["sps"]))
    if "it/s" in line or "s/it" in line:
        m = _TQDM.search(line)
        if m:
            rate = _num(m["rate"])
            step_time = (1.0 / rate if rate > 0 else None) if m["unit"] == "it/s" else rate
            gs = _GLOBAL_STEP.search(m["postfix"])
            step = int(_num(gs["gs"])) if gs else int(m["step"])
            return ParsedProgress(step=step, step_time_s=step_time)
    if "Epoch [" in line:
        m = _MMCV.search(line)
        if m:
            step = (int(m["epoch"]) - 1) * int(m["total"]) + int(m["it"])
            return ParsedProgress(step=step, step_time_s=float(m["time"]))
    if "<epoch:" in line:
        m = _BASICSR.search(line)
        if m:
            return ParsedProgress(step=int(m["it"].replace(",", "")))
    if "{'" in line and _HF_DICT.search(line):
        return ParsedProgress(step=None)
    brace = line.find("{")
    if brace != -1 and line.rstrip().endswith("}") and '"' in line:
        try:
            metrics = _JSON.decode(line[brace:].rstrip())
        except msgspec.DecodeError:
            return None
        step = metrics.step if metrics.step is not None else metrics.global_step or metrics.iteration
        if step is not None:
            return ParsedProgress(step, metrics.step_time_s, metrics.tokens_per_s, metrics.samples_per_s)
    return None


def parse_nvrx_score(line: str) -> RankScore | None:
    """A rank's score from an NVRx straggler report line (``Rank=3 Node=host Score=0.62``).

    >>> parse_nvrx_score("  Rank=1 Node=22ca9bdcfc9a Score=0.62")
    RankScore(rank=1, node='22ca9bdcfc9a', score=0.62)
    """
    if "Score=" not in line:
        return None
    m = _NVRX.search(line)
    return RankScore(int(m["rank"]), m["node"], float(m["score"])) if m else None
