"""A job's per-rank progress: a record of the step the job is already on (most records: every rank reports
each step) takes a short path, which must leave the job exactly as the general path leaves it."""

from __future__ import annotations

import math
import pickle

from hypothesis import given, settings
from hypothesis import strategies as st

from trainguard.detectors.events import JobEvent, ProgressRecord
from trainguard.detectors.monitor import JobMonitor

SECONDS = st.one_of(st.none(), st.floats(0.5, 2.0), st.just(math.nan))
# A rank's record — (rank, how the step moves: 0 the same, 1 the next, -5 back past a checkpoint and, from a
# low step, below zero, where the hang detector's step and the job's part; a compute time; a step time; a
# pipeline stage; how far its clock moved, backwards too) — or the scheduler's word on the job.
PROGRESS = st.tuples(
    st.integers(0, 3),
    st.sampled_from([0, 0, 0, 1, 1, -5]),
    SECONDS,
    SECONDS,
    st.one_of(st.none(), st.integers(0, 1)),
    st.floats(-0.3, 1.0),
)
SCHEDULER = st.sampled_from(["RUNNING", "PENDING", "COMPLETED"])


@settings(max_examples=200, deadline=None, derandomize=True)
@given(st.lists(st.one_of(PROGRESS, SCHEDULER), min_size=1, max_size=150))
def test_the_same_step_path_leaves_the_job_as_the_general_path_does(
    records: list[tuple[int, int, float | None, float | None, int | None, float] | str],
) -> None:
    fast, general = JobMonitor("7"), JobMonitor("7")
    step, ts = 3, 1000.0
    for record in records:
        if isinstance(record, str):
            ts += 1.0
            event: JobEvent | ProgressRecord = JobEvent(ts=ts, job_id="7", state=record, nodes=["n0", "n1"])
        else:
            rank, move, compute, step_time, stage, dt = record
            step += move
            ts += dt
            event = ProgressRecord(
                ts=ts,
                job_id="7",
                node=f"n{rank // 2}",
                rank=rank,
                step=step,
                step_time_s=step_time,
                compute_time_s=compute,
                pp_stage=stage,
            )
        general._progress = general._job_progress  # type: ignore[method-assign]  # every record the long way
        assert repr(fast.observe(event)) == repr(general.observe(event))
        del general._progress
        assert pickle.dumps(fast) == pickle.dumps(general)  # every detector's state, byte for byte


def test_ranks_after_the_first_at_a_step_take_the_short_path() -> None:
    mon, short = JobMonitor("7"), []
    rank_progress = mon._rank_progress
    mon._rank_progress = lambda *a: short.append(a) or rank_progress(*a)  # type: ignore[method-assign]
    for step in (1, 2, 3):
        for rank in range(4):
            mon.observe(ProgressRecord(ts=100.0 * step + rank, job_id="7", node="n1", rank=rank, step=step))
    assert [a[1] for a in short] == [1, 2, 3] * 3  # ranks 1-3 of each step
