"""Rolling medians kept cheaply (the straggler baseline, each rank's window) are statistics.median of their windows."""

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


@settings(max_examples=200, deadline=None, derandomize=True)
@given(
    st.integers(1, 8),
    st.lists(
        st.tuples(st.integers(0, 5), st.one_of(st.floats(0.1, 5.0), st.sampled_from([1.0, 2.0, math.nan]))),
        min_size=1,
        max_size=80,
    ),
)
def test_rank_medians_and_scores_are_statistics_median_s(window: int, timings: list[tuple[int, float]]) -> None:
    scorer = RankScorer(window=window)
    best: dict[int, float] = {}  # each rank's best median so far, as min() keeps it
    for rank, seconds in timings:
        scorer.observe(rank, f"n{rank}", seconds)
        full = {r: list(t) for r, t in scorer._times.items() if len(t) == window}
        medians = {r: median(t) for r, t in full.items()}
        assert repr(scorer._medians()) == repr(medians)  # (repr: NaN is not equal to itself)
        scores = scorer.scores()
        if len(medians) < scorer.min_ranks:
            assert scores == {}
            continue
        ref = median(medians.values())
        expected = {}
        for r, m in medians.items():
            best[r] = min(best.get(r, m), m)
            expected[r] = (min(1.0, ref / m) if m > 0 else 1.0, best[r] / m if m > 0 else 1.0)
        assert repr(scores) == repr(expected)
