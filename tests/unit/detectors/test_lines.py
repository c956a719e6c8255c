"""How one log line is read: a failure outranks a phase or an interval it happens to name,
and a message a terminal wrapped onto two lines is read whole."""

from __future__ import annotations

import pytest

from trainguard.detectors.events import Anomaly, LogRecord
from trainguard.detectors.lines import Matched, PhaseMarker, Rhythm, Unmatched, read_line
from trainguard.detectors.monitor import JobMonitor


@pytest.mark.parametrize(
    "line",
    [
        "./pretrain.sh: line 184: 2324239 Aborted          (core dumped) litgpt pretrain --train.save_interval 500",
        "RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB while saving checkpoint at iteration 400",
    ],
)
def test_a_failure_that_names_a_phase_or_an_interval_is_a_failure(line: str) -> None:
    assert isinstance(read_line(line), Matched)


def test_a_fatal_looking_line_that_names_a_phase_is_kept_for_the_crash_detector() -> None:
    assert read_line("FATAL: could not finish saving checkpoint at iteration 400") == Unmatched()


def test_phases_and_intervals_are_still_read() -> None:
    assert read_line("[default0]: saving checkpoint at iteration 400") == PhaseMarker(starts=True)
    assert read_line("  eval_interval ................................... 1000") == Rhythm("eval_interval", 1000)


def _log(mon: JobMonitor, ts: float, line: str, rank: int | None = 0) -> list[Anomaly]:
    return mon.observe(LogRecord(ts=ts, job_id="7", node="n1", rank=rank, line=line))


HEAD = (
    "[1] 2019-06-13 01:17:08.886805: E external/org_tensorflow/tensorflow/compiler/xla/python/local_client.cc:672] "
    "Execution of replica 0 failed: Resource exhausted: Out "
)


def test_a_wrapped_message_is_read_whole() -> None:
    mon = JobMonitor("7")
    assert _log(mon, 10.0, HEAD) == []
    (anomaly,) = _log(mon, 10.0, "[rank0]: of memory while trying to allocate 5520758552 bytes.")
    assert (anomaly.category, anomaly.layer) == ("oom", "application")
    assert any("Resource exhausted: Out of memory while trying" in line for line in anomaly.evidence)


@pytest.mark.parametrize(("gap_s", "rank"), [(30.0, 0), (0.0, 1)], ids=["printed apart", "another rank"])
def test_lines_that_are_not_a_continuation_are_not_joined(gap_s: float, rank: int) -> None:
    mon = JobMonitor("7")
    _log(mon, 10.0, HEAD)
    assert _log(mon, 10.0 + gap_s, "of memory while trying to allocate 5520758552 bytes.", rank=rank) == []
