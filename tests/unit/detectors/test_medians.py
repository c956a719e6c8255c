"""Medians taken the fast way (a kept sorted window, one numpy median over many) are statistics.median's."""

from __future__ import annotations

import math
import pickle
from statistics import median

from hypothesis import given, settings
from hypothesis import strategies as st

from trainguard.detectors.rank_scores import RankScorer
from trainguard.detectors.straggler import StragglerDetector


@settings(max_examples=200, deadline=None, derandomize=True)
@given(
    st.lists(st.one_of(st.floats(0.5, 3.0), st.sampled_from([1.0, 2.0, math.nan])), min_size=20, max_size=120),
    st.integers(2, 12),
)
def test_the_kept_median_is_the_windows_median_and_old_snapshots_resume(times, window):
    det = StragglerDetector(baseline_steps=window, warmup_steps=0)
    for i, step_time in enumerate(times):
        det.observe_step(float(i), step_time)
        if len(det._baseline) and not any(math.isnan(t) for t in det._baseline):
            assert det._median() == median(det._baseline)
    old = dict(det.__dict__)
    del old["_sorted"]  # a snapshot from before the sorted copy
    resumed = StragglerDetector.__new__(StragglerDetector)
    resumed.__setstate__(pickle.loads(pickle.dumps(old)))
    for i, step_time in enumerate(times[:10], start=len(times)):
        assert repr(resumed.observe_step(float(i), step_time)) == repr(det.observe_step(float(i), step_time))
        assert repr(list(resumed._baseline)) == repr(list(det._baseline))  # (NaN is not equal to itself)


@settings(max_examples=100, deadline=None, derandomize=True)
@given(
    st.integers(16, 40),
    st.lists(st.one_of(st.floats(0.1, 5.0), st.sampled_from([1.0, 2.0, math.inf])), min_size=40, max_size=200),
    st.booleans(),
)
def test_rank_medians_of_many_ranks_are_each_windows_median(ranks, times, with_nan):
    scorer = RankScorer(window=4)  # (even: the two middle values averaged)
    for i, seconds in enumerate(times * 4):
        scorer.observe(i % ranks, "n1", seconds)
    if with_nan:
        scorer.observe(0, "n1", math.nan)
    expected = {r: median(t) for r, t in scorer._times.items() if len(t) == scorer.window}
    assert len(expected) >= 16
    assert repr(scorer._medians()) == repr(expected)  # (NaN is not equal to itself)
