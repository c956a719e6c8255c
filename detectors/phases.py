"""Benign pause markers: checkpoint saves and evaluation phases.

A job that stops stepping while it writes a checkpoint or evaluates is not hung,
and its slower steps are not a straggler. These markers let the hang and
straggler detectors tell the two apart.

>>> phase_marker("[2026-12-02 10:00:00] saving checkpoint at iteration 2000 to /ckpt")
('checkpoint', True)
>>> phase_marker("  successfully saved checkpoint at iteration 2000 to /ckpt")
('checkpoint', False)
>>> phase_marker("Running Evaluation") , phase_marker("iteration 5 | loss 2.0") is None
(('eval', True), True)
"""

from __future__ import annotations

import re

# (phase, starts?) for each marker; ends are tested first because
# "saved checkpoint" would also match a loose "checkpoint" start pattern.
_MARKERS: tuple[tuple[re.Pattern[str], str, bool], ...] = (
    (
        re.compile(
            r"(?i)successfully saved checkpoint|checkpoint saved|saved checkpoint|"
            r"finished saving checkpoint"
        ),
        "checkpoint",
        False,
    ),
    (
        re.compile(
            r"(?i)saving (?:model )?checkpoint|checkpointing|writing checkpoint|"
            r"save_checkpoint"
        ),
        "checkpoint",
        True,
    ),
    (
        re.compile(
            r"(?i)evaluation (?:done|finished|complete)|validation (?:done|end)|"
            r"end of validation"
        ),
        "eval",
        False,
    ),
    (re.compile(r"(?i)running evaluation|\bevaluating\b|validation (?:start|loop)|starting evaluation"), "eval", True),
)

_PREFILTER = re.compile(r"(?i)checkpoint|evaluat|validation")


def phase_marker(line: str) -> tuple[str, bool] | None:
    """``(phase, starts)`` when the line marks a benign phase boundary."""
    if _PREFILTER.search(line) is None:
        return None
    for pattern, phase, starts in _MARKERS:
        if pattern.search(line):
            return phase, starts
    return None
