"""A job's per-rank progress: a record of the step the job is already on (most records: every rank reports
each step) takes a short path, which must leave the job exactly as the general path leaves it."""

from __future__ import annotations

import pickle

from hypothesis import given, settings
from hypothesis import strategies as st

from trainguard.detectors.events import ProgressRecord
from trainguard.detectors.monitor import JobMonitor

# (rank, how the step moves: 0 the same, 1 the next, -5 back to a checkpoint, None no step number, seconds)
RECORD = st.tuples(st.integers(0, 3), st.sampled_from([0, 0, 0, 1, 1, -5, None]), st.floats(0.5, 2.0))


@settings(max_examples=150, deadline=None, derandomize=True)
@given(st.lists(RECORD, min_size=1, max_size=150))
def test_the_same_step_path_leaves_the_job_as_the_general_path_does(records):
    fast, general = JobMonitor("7"), JobMonitor("7")
    general._progress = general._job_progress  # type: ignore[method-assign]  # every record the long way
    step, ts = 10, 1000.0
    for rank, move, seconds in records:
        step = max(0, step + (move or 0))
        ts += 0.5
        record = ProgressRecord(
            ts=ts, job_id="7", node=f"n{rank // 2}", rank=rank, step=None if move is None else step, step_time_s=seconds
        )
        assert repr(fast.observe(record)) == repr(general.observe(record))
        del general._progress
        assert pickle.dumps(fast) == pickle.dumps(general)  # every detector's state, byte for byte
        general._progress = general._job_progress  # type: ignore[method-assign]


def test_ranks_after_the_first_at_a_step_take_the_short_path():
    mon, short = JobMonitor("7"), []
    rank_progress = mon._rank_progress
    mon._rank_progress = lambda *a: short.append(a) or rank_progress(*a)  # type: ignore[method-assign]
    for step in (1, 2, 3):
        for rank in range(4):
            mon.observe(ProgressRecord(ts=100.0 * step + rank, job_id="7", node="n1", rank=rank, step=step))
    assert [a[1] for a in short] == [1, 2, 3] * 3  # ranks 1-3 of each step
