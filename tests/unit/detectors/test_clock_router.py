"""The event-time clock and the router: watermarks, ticks, reordering, the job↔node join."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from trainguard.detectors.clock import EventClock
from trainguard.detectors.events import DeadLetter, GpuSample, JobEvent, LogRecord, ProgressRecord, Tick
from trainguard.detectors.frames import GpuFrame
from trainguard.detectors.routing import DEAD, Router, RouterSettings


def test_watermark_is_the_slowest_partition_minus_lateness_and_never_goes_back():
    clock = EventClock(lateness_s=2, tick_s=5)
    clock.observe("a", 100)
    clock.observe("b", 50)
    assert clock.watermark() == 48
    clock.observe("b", 40)  # late event: no step back
    assert clock.watermark() == 48
    clock.observe("b", 200)
    assert clock.watermark() == 98


def test_expected_partition_holds_the_clock_until_it_speaks_or_goes_idle():
    clock = EventClock(lateness_s=0, tick_s=5, idle_after_s=2)
    clock.expect("slow", wall=1000.0)
    clock.observe("fast", 500.0, wall=1000.0)
    assert clock.watermark(wall=1001.0) == float("-inf")
    # Two wall seconds of silence from "slow": it stops holding the clock.
    clock.observe("fast", 510.0, wall=1002.5)
    assert clock.watermark(wall=1002.5) == 510.0


def test_with_drain_reports_only_a_drained_partition_stops_holding_the_clock():
    """A silent partition may just be slow to read (a busy worker, a slow first fetch): it holds
    the clock until its source says it has read all its broker holds, and again once that goes stale."""
    clock = EventClock(lateness_s=0, tick_s=5, idle_after_s=2, drain_reports=True)
    clock.expect("slow", wall=1000.0)
    clock.observe("fast", 500.0, wall=1000.0)
    clock.observe("fast", 510.0, wall=1005.0)
    assert clock.watermark(wall=1005.0) == float("-inf")  # five silent seconds, but not drained
    clock.drained("slow", wall=1005.5)
    assert clock.watermark(wall=1006.0) == 510.0
    clock.observe("fast", 520.0, wall=1010.0)  # no fresh report since 1005.5: "slow" may have records again
    assert clock.watermark(wall=1010.0) == 510.0
    clock.drained("slow", wall=1010.0)
    assert clock.watermark(wall=1010.0) == 520.0
    clock.observe("slow", 521.0, wall=1011.0)  # it spoke after its report: busy until it drains again
    clock.observe("fast", 530.0, wall=1014.0)
    assert clock.watermark(wall=1014.0) == 521.0


def test_a_router_with_drain_reports_releases_a_slow_partition_in_order():
    from trainguard.detectors.shards import Drained

    def run(drain_reports: bool) -> list[tuple[str, float]]:
        router = Router(
            RouterSettings(lateness_s=0, tick_s=5, idle_after_s=2),
            ["gpu/0", "logs/0"],
            1000.0,
            drain_reports=drain_reports,
        )
        out = []
        for second in range(6):  # logs flow; gpu/0's consumer has not delivered yet
            out += router.route(
                "logs/0", LogRecord(ts=100.0 + second * 10, job_id="1", node="n", line="x"), wall=1000.0 + second
            )
        out += router.route("gpu/0", GpuSample(ts=105.0, node="n", gpu=0), wall=1006.0)
        out += router.route("logs/0", Drained(), wall=1006.5)
        out += router.route("gpu/0", Drained(), wall=1006.5)
        out += router.idle(1009.0)
        return [(type(item).__name__, item.ts if hasattr(item, "ts") else item.watermark) for _, item in out]

    in_order = run(drain_reports=True)
    released = [ts for kind, ts in in_order if kind != "Tick"]
    assert released == sorted(released) and ("GpuSample", 105.0) in in_order
    overtaken = run(drain_reports=False)  # silence alone: the late GPU sample comes after later lines
    released = [ts for kind, ts in overtaken if kind != "Tick"]
    assert released != sorted(released)


def test_live_clock_moves_with_the_wall_when_every_source_is_silent():
    clock = EventClock(lateness_s=1, tick_s=5, idle_after_s=2)
    clock.observe("a", 100.0, wall=1000.0)
    assert clock.watermark(wall=1001.0) == 99.0
    assert clock.watermark(wall=1030.0) == 99.0 + 30.0


def test_every_grid_tick_is_handed_out_once():
    clock = EventClock(lateness_s=0, tick_s=5, max_catchup_ticks=4)
    clock.observe("a", 100.0)
    assert clock.ticks() == [100.0]
    clock.observe("a", 117.0)
    assert clock.ticks() == [105.0, 110.0, 115.0]
    assert clock.ticks() == []
    clock.observe("a", 1000.0)  # a long gap jumps instead of flooding
    assert clock.ticks() == [985.0, 990.0, 995.0, 1000.0]


def _ev(cls, **kw):
    return cls(**kw)


def test_router_releases_in_timestamp_order_and_ticks_after_the_events():
    router = Router(RouterSettings(lateness_s=5, tick_s=5))
    out = []
    for ts in (100.0, 103.0, 101.0, 109.0, 112.0):
        out += router.route("p", ProgressRecord(ts=ts, job_id="1", node="n", rank=0, step=int(ts)))
    items = [v for _, v in out]
    released = [v.ts for v in items if isinstance(v, ProgressRecord)]
    assert released == [100.0, 101.0, 103.0]  # 109 and 112 wait for the watermark (112 - 5 = 107)
    ticks = [v.watermark for v in items if isinstance(v, Tick)]
    assert ticks == [100.0, 105.0]  # the 95 s tick found no key yet: nothing was released
    # No tick overtakes an event it covers.
    last_tick_index = max(i for i, v in enumerate(items) if isinstance(v, Tick) and v.watermark == 105.0)
    assert all(i < last_tick_index for i, v in enumerate(items) if isinstance(v, ProgressRecord))
    rest = router.finish()
    assert [v.ts for _, v in rest if isinstance(v, ProgressRecord)] == [109.0, 112.0]


def test_router_joins_node_events_to_the_job_running_there():
    router = Router(RouterSettings(lateness_s=0, tick_s=5))
    router.route("p", JobEvent(ts=10.0, job_id="42", state="RUNNING", nodes=["n1", "n2"]))
    keyed = router.route("p", LogRecord(ts=11.0, node="n2", source="kernel", line="NVRM: Xid"))
    assert keyed[0][0] == "job/42" and keyed[0][1].job_id == "42"
    idle = router.route("p", LogRecord(ts=12.0, node="n9", source="kernel", line="NVRM: Xid"))
    assert idle[0][0] == "node/n9"
    sample = router.route("p", GpuSample(ts=13.0, node="n1", gpu=0))
    assert sample[0][0] == "job/42" and sample[0][1].job_id == "42"  # the job compares its GPUs
    idle_sample = router.route("p", GpuSample(ts=14.0, node="n9", gpu=0))
    assert idle_sample[0][0] == "node/n9" and idle_sample[0][1].job_id is None
    router.route("p", JobEvent(ts=20.0, job_id="42", state="COMPLETED", nodes=["n1", "n2"]))
    after = router.route("p", GpuSample(ts=21.0, node="n1", gpu=0))
    assert after[0][0] == "node/n1" and after[0][1].job_id is None


def test_router_dead_letters_timestamps_far_from_the_clock_with_the_original_bytes():
    router = Router(RouterSettings(lateness_s=0, tick_s=5, max_future_s=3600, max_late_s=3600))
    router.route("logs/0", LogRecord(ts=100_000.0, node="n", line="ok"), order=(0, 0, 1))
    future = router.route("logs/0", LogRecord(ts=200_000.0, node="n", line="x"), order=(0, 0, 2), payload=b"orig")
    assert future[0][0] == DEAD and isinstance(future[0][1], DeadLetter)
    assert "ahead of the newest event" in future[0][1].reason and future[0][1].payload == b"orig"
    assert future[0][1].topic == "logs" and future[0][1].offset == 2
    late = router.route("logs/0", LogRecord(ts=90_000.0, node="n", line="x"))
    assert late[0][0] == DEAD and "behind the watermark" in late[0][1].reason
    live = Router(RouterSettings(lateness_s=0, idle_after_s=2))
    ahead = live.route("logs/0", LogRecord(ts=100_000.0, node="n", line="x"), wall=10_000.0)
    assert ahead[0][0] == DEAD and "ahead of the wall clock" in ahead[0][1].reason


def test_router_stops_ticking_finished_jobs():
    router = Router(RouterSettings(lateness_s=0, tick_s=5, linger_s=10))
    router.route("p", JobEvent(ts=0.0, job_id="1", state="RUNNING", nodes=["n"]))
    router.route("p", JobEvent(ts=5.0, job_id="1", state="COMPLETED", nodes=["n"]))
    router.route("p", LogRecord(ts=100.0, job_id="2", node="m", line="x"))
    assert "job/1" not in router.active and "job/2" in router.active


def test_a_router_snapshot_from_before_placements_still_resumes():
    import pickle

    router = Router(RouterSettings(lateness_s=0, tick_s=5))
    router.route("s/0", JobEvent(ts=100.0, job_id="7", state="RUNNING", nodes=["n1"]))
    old = dict(router.__dict__)  # what an earlier version pickled: the map lived on the router itself
    for name in ("placement", "nodes_broadcast", "misrouted", "_named"):
        old.pop(name)
    old["job_nodes"] = router.placement.job_nodes
    router.__dict__ = old
    resumed = pickle.loads(pickle.dumps(router))
    assert [k for k, _ in resumed.route("s/0", GpuSample(ts=106.0, node="n1", gpu=0))][-1] == "job/7"
    resumed.route("s/0", JobEvent(ts=110.0, job_id="7", state="COMPLETED"))
    assert resumed.node_job == {} and resumed.placement.node_job is resumed.node_job


def test_router_and_monitor_read_every_job_state_alike():
    """One job-lifecycle definition: a held or requeued job keeps its ticks and its monitor keeps waiting."""
    from trainguard.detectors import job_states
    from trainguard.detectors.monitor import JobMonitor

    for state in sorted(job_states.RUNNING | job_states.WAITING | job_states.FINISHED):
        router = Router(RouterSettings())
        router.route("0", JobEvent(ts=1.0, job_id="7", state=state, nodes=["n1"]))
        router.route("0", LogRecord(ts=20.0, job_id="7", node="n1", line="x"))
        monitor = JobMonitor("7")
        monitor.observe(JobEvent(ts=1.0, job_id="7", state=state, nodes=["n1"]))
        ended = "job/7" in router.ended
        assert ended == job_states.has_ended(state) == (monitor.ended_at is not None), state


@settings(max_examples=150, deadline=None, derandomize=True)
@given(
    st.lists(st.tuples(st.integers(0, 29), st.integers(0, 2)), min_size=1, max_size=120),
    st.lists(st.integers(1, 40), min_size=1, max_size=10),
)
def test_however_events_are_batched_they_leave_in_timestamp_topic_offset_order(events, sizes):
    records = [
        # Each event up to 2.9 s out of place: within the lateness, so none is late.
        ((topic, 0, i), ProgressRecord(ts=1000.0 + i / 2 + tenth / 10, job_id="1", node="n", rank=0, step=i))
        for i, (tenth, topic) in enumerate(events)
    ]

    def released(batch_sizes: list[int]) -> list[tuple[float, int]]:
        router = Router(RouterSettings(lateness_s=10, tick_s=5))  # ~20 waiting: one by one, each is put in place
        out, i, turn = [], 0, 0
        while i < len(records):
            size = batch_sizes[turn % len(batch_sizes)]
            out += router.route_batch([("p", order, event, None) for order, event in records[i : i + size]])
            i, turn = i + size, turn + 1
        out += router.finish()
        return [(v.ts, v.step) for _, v in out if isinstance(v, ProgressRecord)]

    expected = [(e.ts, e.step) for order, e in sorted(records, key=lambda r: (r[1].ts, r[0]))]
    assert released([1]) == released(sizes) == expected  # one by one (into a long buffer) and in batches


def test_a_job_gets_the_same_ticks_however_late_the_watermark_is_first_known():
    """A live run reads a dense partition far ahead while a sparse one (a few scheduler records, a
    batch of log lines spanning half an hour) has yet to deliver: the watermark is first known far
    into the data. The ticks before it must still be handed out, in place: a hang's deadline there
    fires at its own tick, as in a replay that knew the watermark from the start."""

    def job_ticks(batches: list[list[tuple[str, object]]]) -> list[float]:
        router = Router(RouterSettings(lateness_s=2, tick_s=5), partitions=["progress/0", "scheduler/0"])
        out = []
        for batch in batches:
            out += router.route_batch([(p, (0, 0, i), ev, None) for i, (p, ev) in enumerate(batch)])
        out += router.finish()
        return [item.watermark for key, item in out if key == "job/7" and type(item) is Tick]

    steps = [
        ("progress/0", _ev(ProgressRecord, ts=100.0 + 10 * i, job_id="7", node="n1", rank=0, step=i)) for i in range(60)
    ]
    sched = [("scheduler/0", JobEvent(ts=95.0, job_id="7", state="RUNNING", nodes=["n1"]))]
    sched += [("scheduler/0", JobEvent(ts=800.0, job_id="7", state="COMPLETED"))]
    in_step = job_ticks([sched[:1] + steps[:1]] + [[s] for s in steps[1:]] + [sched[1:]])
    scheduler_last = job_ticks([steps, sched])  # the sparse partition delivers only after the dense one is read
    assert scheduler_last == in_step
    assert scheduler_last[:3] == [95.0, 100.0, 105.0]


@settings(max_examples=100, deadline=None, derandomize=True)
@given(
    st.lists(
        st.tuples(st.sampled_from(["ok", "late", "ahead", "dead"]), st.integers(0, 3), st.floats(0, 30)),
        min_size=1,
        max_size=80,
    ),
    st.integers(1, 30),
)
def test_a_replay_window_is_routed_as_its_records_would_be(rows, size):
    # route_window takes the merge's (sort key, topic, offset, event or dead letter, bytes) as they are:
    # what leaves must be what route_batch gives for the same records made Routed, dead letters first.
    records = []
    for offset, (kind, topic, dt) in enumerate(rows):
        ts = {"ok": 100_000.0 + dt, "late": 90_000.0, "ahead": 200_000.0, "dead": 100_000.0}[kind]
        event = (
            DeadLetter(topic="logs", partition=0, offset=offset, reason="bad", payload=b"x")
            if kind == "dead"
            else LogRecord(ts=ts, job_id=str(topic), node="n", line=f"line {offset}")
        )
        records.append((ts, topic, offset, event, f"{offset}".encode()))

    def run(route) -> list:
        router = Router(RouterSettings(lateness_s=5, tick_s=5, max_future_s=3600, max_late_s=3600))
        out = []
        for i in range(0, len(records), size):
            out += route(router, records[i : i + size])
        return out + router.finish()

    def as_batch(router: Router, chunk: list) -> list:
        dead = [(DEAD, event) for _, _, _, event, _ in chunk if type(event) is DeadLetter]
        routed = [("replay/0", (t, 0, o), e, p) for _, t, o, e, p in chunk if type(e) is not DeadLetter]
        return dead + router.route_batch(routed)

    assert run(lambda router, chunk: router.route_window(chunk, "replay/0")) == run(as_batch)


def test_a_replay_frame_refused_by_the_window_route_is_a_dead_letter_per_gpu():
    # A frame the replay reader cut from its rows has no bytes: each GPU's record is refused at its own offset.
    router = Router(RouterSettings(lateness_s=0, tick_s=5, max_future_s=3600, max_late_s=3600))
    first = LogRecord(ts=100_000.0, node="n", line="ok")
    frame = GpuFrame.from_samples([GpuSample(ts=200_000.0, node="n", gpu=g, util_pct=1.0) for g in range(3)])
    out = router.route_window([(100_000.0, 0, 7, first, b"x"), (100_000.0, 2, 40, frame, None)], "replay/0")
    dead = [item for key, item in out if key == DEAD]
    assert [(d.topic, d.offset) for d in dead] == [("gpu", 40), ("gpu", 41), ("gpu", 42)]
    assert all("ahead of the newest event" in d.reason for d in dead)
    assert [json.loads(d.payload)["gpu"] for d in dead] == [0, 1, 2]
