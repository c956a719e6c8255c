"""Turn training-framework log lines into progress observations.

Only rank 0 (or the last rank) usually prints iteration lines, so these parsed
observations are job-level: they say the job as a whole made a step.

>>> parse_progress("iteration      120/  500000 | consumed samples: 7680 | "
...                "elapsed time per iteration (ms): 4247.9 | learning rate: 1.0E-04 |")
ParsedProgress(step=120, step_time_s=4.2479, tokens_per_s=None, samples_per_s=None)
>>> parse_progress("step: 40  loss:  7.1234  memory: 30.1GiB(40.2%)  tps: 5,320  mfu: 30.2%")
ParsedProgress(step=40, step_time_s=None, tokens_per_s=5320.0, samples_per_s=None)
>>> parse_progress("Saving checkpoint") is None
True
"""

from __future__ import annotations

import re
from typing import NamedTuple

import msgspec


class ParsedProgress(NamedTuple):
    step: int
    step_time_s: float | None = None
    tokens_per_s: float | None = None
    samples_per_s: float | None = None


_NUM = r"[-+]?\d[\d,]*\.?\d*(?:[eE][-+]?\d+)?"

_MEGATRON = re.compile(
    r"iteration\s+(?P<step>\d+)\s*/\s*\d+\s*\|.*?elapsed time per iteration \((?P<unit>ms|s)\):\s*"
    rf"(?P<elapsed>{_NUM})"
)
_MEGATRON_SPS = re.compile(rf"samples per second:\s*(?P<sps>{_NUM})")
_TORCHTITAN = re.compile(rf"\bstep:\s*(?P<step>\d+)\b.*?\btps:\s*(?P<tps>{_NUM})")
_DEEPSPEED = re.compile(rf"\bsteps?[:=]\s*(?P<step>\d+)\b.*?samples/sec[=:]\s*(?P<sps>{_NUM})")


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


def parse_progress(line: str) -> ParsedProgress | None:
    """A progress observation from one log line, or ``None`` when it holds none."""
    if "iteration" in line and "elapsed time per iteration" in line:
        m = _MEGATRON.search(line)
        if m:
            elapsed = _num(m["elapsed"])
            sps = _MEGATRON_SPS.search(line)
            return ParsedProgress(
                step=int(m["step"]),
                step_time_s=elapsed / 1000.0 if m["unit"] == "ms" else elapsed,
                samples_per_s=_num(sps["sps"]) if sps else None,
            )
    if "tps:" in line:
        m = _TORCHTITAN.search(line)
        if m:
            return ParsedProgress(step=int(m["step"]), tokens_per_s=_num(m["tps"]))
    if "samples/sec" in line:
        m = _DEEPSPEED.search(line)
        if m:
            return ParsedProgress(step=int(m["step"]), samples_per_s=_num(m["sps"]))
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
