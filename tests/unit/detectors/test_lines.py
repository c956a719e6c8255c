"""How one log line is read: a failure outranks a phase or an interval it happens to name,
and a message a terminal wrapped onto two lines is read whole."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from trainguard.detectors.events import Anomaly, LogRecord
from trainguard.detectors.lines import Matched, PhaseMarker, Progress, Rhythm, Unmatched, read_line
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


def _record(ts: float, line: str, node: str = "n1", rank: int | None = 0) -> LogRecord:
    return LogRecord(ts=ts, job_id="7", node=node, rank=rank, line=line)


CONTINUATION = "of memory while trying to allocate 5520758552 bytes."


@pytest.mark.parametrize(
    "records",
    [
        [_record(10.0, HEAD), _record(40.0, CONTINUATION)],
        [_record(10.0, HEAD), _record(10.0, CONTINUATION, rank=1)],
        [_record(10.0, HEAD, rank=None), _record(10.0, CONTINUATION, node="n2", rank=None)],
        [_record(10.0, HEAD), _record(10.0, "step 5 | loss 1.2 | 0.5 s/it"), _record(10.0, CONTINUATION)],
        # A record of its own (NCCL's host:pid:tid header) is never a continuation, whatever joining would say.
        [
            _record(
                10.0,
                "[2024-05-01 12:00:00,123] [INFO] [stage3.py:1850:_overflow_clean_up] [Rank 0] Overflow detected. "
                "Skipping step. Attempted loss scale: 65536, reducing to 32768",
            ),
            _record(10.2, "dgx-01:1234:1300 [0] NCCL INFO [Service thread] Connection closed by localRank 3"),
        ],
    ],
    ids=["printed apart", "another rank", "another node", "a line in between", "a record header"],
)
def test_lines_that_are_not_a_continuation_are_not_joined(records: list[LogRecord]) -> None:
    mon = JobMonitor("7")
    assert [a for rec in records for a in mon.observe(rec)] == []


def test_a_fault_after_a_progress_bars_last_redraw_is_read() -> None:
    reading = read_line("Epoch 1:  37%|###7      | 370/1000 [01:02<01:46,  5.91it/s]\rValueError: bad shape")
    assert isinstance(reading, Progress) and reading.match is not None


ADVERSARIAL = [
    "[rank1]: 1: " * 40 + "loading GPU shard",  # repeated launcher prefixes
    "[1,2]<stderr>:[rank1]: 1: " * 60,
    "2024-05-01 12:00:00 ERROR " * 60,
    "2024-05-01 12:00:00,123 ERROR" + " " * 8000 + "GPU Error: x",  # a long run of spaces after the level
    "2024-05-01 " + "1" * 100_000 + "!",
    " " * 8000 + "x",  # indentation without end
    " \t" * 4000,
]


def test_no_line_makes_the_reader_backtrack_without_end() -> None:
    """Each of these took seconds to hours with an envelope that could re-split what it matched; run in
    a child process so a regression fails (on the timeout) instead of hanging the suite."""
    code = (
        "import json, sys\n"
        "from trainguard.detectors.lines import read_line\n"
        "from trainguard.detectors.signatures import looks_fatal, strip_envelope\n"
        "for line in json.load(sys.stdin):\n"
        "    read_line(line); looks_fatal(line); strip_envelope(line)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], input=json.dumps(ADVERSARIAL), text=True, timeout=120, check=False
    )
    assert done.returncode == 0
