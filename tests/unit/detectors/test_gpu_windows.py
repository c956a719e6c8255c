"""Node windows keep exactly each GPU's last samples, however a node's GPUs come and go."""

from __future__ import annotations

import pickle
from collections import deque

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from trainguard.detectors.events import GpuSample
from trainguard.detectors.frames import FIELDS, GpuFrame
from trainguard.detectors.gpu_activity import GpuActivity
from trainguard.detectors.gpu_peers import GpuPeers
from trainguard.detectors.gpu_windows import GpuWindows


def _stamp(frame: GpuFrame, i: int) -> tuple[float, int]:
    return frame.ts, frame.gpus[i]


# Each step: a node, and which of its 4 GPUs report (usually all of them).
_GPUS = st.one_of(st.just((0, 1, 2, 3)), st.sampled_from([(0, 1, 3), (1, 0), (2,), (0, 0), (2, 2, 3)]))
_STEPS = st.lists(st.tuples(st.sampled_from(["a", "b"]), _GPUS), max_size=40)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(_STEPS, st.integers(min_value=1, max_value=4))
def test_windows_hold_each_gpus_last_samples_in_first_seen_order(steps, keep):
    windows = GpuWindows(keep, _stamp)
    expected: dict[tuple[str, int], deque] = {}  # the plain way: a window per GPU
    for t, (node, gpus) in enumerate(steps):
        frame = GpuFrame(float(t), node, gpus, np.zeros((len(FIELDS), len(gpus))))
        windows.append(frame)
        for gpu in gpus:  # (a GPU twice in one sweep: twice in its window, as it came)
            expected.setdefault((node, gpu), deque(maxlen=keep)).append((float(t), gpu))
    assert [(k, w) for k, w in windows.items()] == [(k, list(w)) for k, w in expected.items()]
    assert dict(windows.items(last=1)) == {k: list(w)[-1:] for k, w in expected.items()}
    for after in (-1.0, len(steps) / 2, float(len(steps))):  # what a caller keeps of them: the samples after then
        assert [(k, [s for s in w if s[0] > after]) for k, w in windows.items(after=after)] == [
            (k, [s for s in w if s[0] > after]) for k, w in expected.items()
        ]
    newest = {(f.node, g): f.ts for f in windows.newest_frames() for g in f.gpus}
    newest.update({k: s[0] for k, s in windows.newest_apart()})
    assert newest == {k: w[-1][0] for k, w in expected.items()}
    assert len(windows) == len(expected)


def _samples(node: str, ts: float, gpus: range, util: float = 99.0, power: float = 500.0) -> list[GpuSample]:
    return [GpuSample(ts=ts, node=node, gpu=g, util_pct=util, power_w=power + g, sm_clock_mhz=1980.0) for g in gpus]


def test_a_gpu_that_falls_off_keeps_its_last_sightings_and_is_reported_missing():
    peers = GpuPeers()
    for t in range(5):
        peers.observe(GpuFrame.from_samples(_samples("n1", 10.0 * t, range(8))))
    for t in range(5, 12):
        peers.observe(GpuFrame.from_samples(_samples("n1", 10.0 * t, range(7))))  # GPU 7 fell off the bus
    assert peers.missing(115.0, 30.0) == [("n1", 7, 40.0)]


def test_snapshots_written_before_node_windows_resume_with_the_same_windows():
    peers, activity = GpuPeers(), GpuActivity()
    frames = [GpuFrame.from_samples(_samples("n1", 10.0 * t, range(4))) for t in range(8)]
    for frame in frames:
        peers.observe(frame)
        activity.observe(frame, stepping=True)
    # The state those versions pickled: a deque per GPU ((frame, column) for peers, (ts, util, power) for activity).
    old_peers = dict(peers.__dict__, _samples={k: deque(w, maxlen=6) for k, w in peers._samples.items()})
    old_activity = dict(
        activity.__dict__,
        _recent={k: list(w) for k, w in activity._recent.items()},
        _train_power={(n, g): level for n, levels in activity.train_power.items() for g, level in levels.items()},
    )
    del old_activity["_unlearned"]  # (those versions learned each frame as it came)
    resumed_peers, resumed_activity = GpuPeers.__new__(GpuPeers), GpuActivity.__new__(GpuActivity)
    resumed_peers.__setstate__(old_peers)
    resumed_activity.__setstate__(old_activity)
    assert list(resumed_peers._samples.items()) == list(peers._samples.items())
    assert list(resumed_activity._recent.items()) == list(activity._recent.items())
    later = GpuFrame.from_samples(_samples("n1", 90.0, range(4), util=100.0, power=200.0))  # busy, at 40 %: spinning
    for detector in (activity, resumed_activity):
        detector.observe(later, stepping=False)
    assert resumed_activity.verdict(since=85.0) == activity.verdict(since=85.0)
    assert activity.verdict(since=85.0).state == "spinning"  # (the learned power levels were read)
    assert pickle.loads(pickle.dumps(resumed_peers)).odd_one_out() == peers.odd_one_out()


@settings(max_examples=200, deadline=None, derandomize=True)
@given(
    st.lists(
        st.tuples(st.sampled_from(["a", "b"]), _GPUS, st.booleans(), st.sampled_from([30.0, 60.0, 99.0])),
        max_size=150,
    ),
    st.integers(min_value=0, max_value=149),
)
def test_training_power_learned_in_bulk_is_the_level_learned_frame_by_frame(steps, snapshot_at):
    activity = GpuActivity()
    expected: dict[str, dict[int, float]] = {}  # the plain way: each GPU's level moved as each sample comes
    for t, (node, gpus, stepping, util) in enumerate(steps):
        powers = [float("nan") if (t + g) % 7 == 0 else 100.0 + 13.0 * g + (t * 37 % 11) for g in gpus]
        values = np.full((len(FIELDS), len(gpus)), np.nan)
        values[FIELDS.index("util_pct")] = util
        values[FIELDS.index("power_w")] = powers
        activity.observe(GpuFrame(float(t), node, gpus, values), stepping)
        if t == snapshot_at:  # a snapshot on the way learns what is kept, and resumes the same
            activity = pickle.loads(pickle.dumps(activity))
        levels = expected.setdefault(node, {}) if stepping else {}
        for gpu, power in zip(gpus, powers, strict=True):
            if stepping and power == power and util >= 50.0:
                level = levels.get(gpu)
                levels[gpu] = power if level is None else level + 0.1 * (power - level)
    assert activity.train_power == expected


def test_a_node_whose_sweep_was_cut_in_two_is_kept_a_frame_at_a_time_again_once_whole():
    windows = GpuWindows(3, _stamp)
    zeros = np.zeros((len(FIELDS), 8))
    windows.append(GpuFrame(0.0, "n1", tuple(range(8)), zeros))
    windows.append(GpuFrame(10.0, "n1", (0, 1, 2), zeros[:, :3]))  # a sweep cut where a replay block ended
    windows.append(GpuFrame(10.0, "n1", (3, 4, 5, 6, 7), zeros[:, 3:]))
    for t in (20.0, 30.0):
        windows.append(GpuFrame(t, "n1", tuple(range(8)), zeros))
    assert "n1" not in windows._frames  # two whole frames: not yet its GPUs' last three samples
    windows.append(GpuFrame(40.0, "n1", tuple(range(8)), zeros))
    assert "n1" in windows._frames and not windows._gpus
    assert dict(windows.items())[("n1", 4)] == [(20.0, 4), (30.0, 4), (40.0, 4)]


def test_a_node_kept_gpu_by_gpu_holds_no_more_frames_than_its_windows():
    windows = GpuWindows(3, _stamp)
    zeros = np.zeros((len(FIELDS), 8))
    windows.append(GpuFrame(0.0, "n1", tuple(range(8)), zeros))
    for t in range(1, 200):  # GPU 7 fell off the bus for good: the node never becomes whole again
        windows.append(GpuFrame(float(t), "n1", tuple(range(7)), zeros[:, :7]))
    assert len(windows._runs["n1"]) == 3
