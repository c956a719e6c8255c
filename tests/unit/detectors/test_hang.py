"""The hang detector's step interval, kept as steps arrive."""

from __future__ import annotations

import random

from trainguard.detectors.hang import HangDetector, _quantile


def test_the_kept_interval_is_the_window_quantile_as_it_slides():
    det = HangDetector(warmup_steps=1, window=20)
    rng = random.Random(4)
    ts = 1000.0
    for step in range(200):
        ts += rng.choice((1.0, 1.0, 2.5, rng.uniform(0.5, 3.0)))  # repeats too: equal values leave the window
        det.observe_progress(ts, step, rank=0, node="n1")
        if det._intervals:
            assert det.interval() == _quantile(list(det._intervals), 0.9)
    assert len(det._intervals) == 20 and det._ordered == sorted(det._intervals)


def test_a_snapshot_from_before_the_kept_interval_resumes():
    det = HangDetector(warmup_steps=1)
    for step in range(30):
        det.observe_progress(1000.0 + 2 * step, step, rank=0, node="n1")
    state = dict(det.__dict__)
    del state["_ordered"], state["_interval"]  # what an earlier version pickled
    old = HangDetector.__new__(HangDetector)
    old.__setstate__(state)
    assert old.interval() == det.interval() == 2.0
    old.observe_progress(1000.0 + 2 * 30 + 5, 30, rank=0, node="n1")
    assert old._ordered == sorted(old._intervals)
