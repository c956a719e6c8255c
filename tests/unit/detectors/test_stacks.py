"""Hangs localised from the ranks' Python stacks: real py-spy dumps grouped, and the hang anomaly revised.

The dumps are real: small Python processes pose as a job's ranks (three wait in ``all_reduce``,
one loops in ``load_batch``, one is stopped with SIGSTOP) and ``collect-stacks``' own
:func:`dump_job` reads them with py-spy. Every process is stopped by PID when its test ends.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import msgspec
import pytest

from tests.support.stack_procs import job_env, rank_processes
from trainguard.agents.jobprocs import process_state
from trainguard.agents.stacks import dump_job
from trainguard.detectors.events import (
    Anomaly,
    DeadLetter,
    JobEvent,
    ProgressRecord,
    StacksRecord,
    decode,
)
from trainguard.detectors.monitor import JobMonitor
from trainguard.detectors.stacks import localise, process_stack


@pytest.fixture(scope="module")
def dumps(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    """One real round: ranks 0, 1, 3 in all_reduce, rank 2 in load_batch, rank 4 stopped (in all_reduce)."""
    job = f"tg-stacks-{os.getpid()}"
    with rank_processes(tmp_path_factory.mktemp("ranks")) as ranks:
        pids = [ranks.start(job_env(job, rank, 5, "loader" if rank == 2 else "collective"))[0] for rank in range(5)]
        ranks.settle()
        os.kill(pids[4], signal.SIGSTOP)
        deadline = time.monotonic() + 5
        while (process_state(pids[4]) or ("gone",))[0] != "stopped" and time.monotonic() < deadline:
            time.sleep(0.02)
        return dump_job(job, "n1")


def test_real_dumps_follow_the_wire_contract(dumps: list[dict]) -> None:
    assert [r["rank"] for r in dumps] == [0, 1, 2, 3, 4]
    for record in dumps:
        event = decode("stacks", msgspec.json.encode(record))
        assert isinstance(event, StacksRecord), getattr(event, "reason", event)
        assert event.threads and event.threads[0].name == "MainThread" and event.error is None
        assert all(f.line is not None for f in event.threads[0].frames)  # kept on the wire, ignored by grouping
    states = [r["state"] for r in dumps]
    assert states[:2] + states[3:] == ["sleeping", "sleeping", "sleeping", "stopped"]
    assert states[2] in ("running", "sleeping")  # the loader loops: caught between two sleeps or in one


def test_the_rank_in_its_data_loader_and_the_stopped_rank_stand_out(dumps: list[dict]) -> None:
    verdict = localise(dumps)
    assert verdict.outlier_ranks == [2, 4] and verdict.outlier_nodes == ["n1"]
    healthy, *others = verdict.groups
    assert (healthy.ranks, healthy.outlier, healthy.state) == ([0, 1, 3], False, None)
    assert healthy.where.startswith("all_reduce ← train_step ← main")  # threading's own waiting is not named
    assert healthy.frames[:3] == ["Condition.wait (threading.py)", "Event.wait (threading.py)", "all_reduce (rank.py)"]
    by_rank = {tuple(g.ranks): g for g in others}
    assert by_rank[(2,)].where.startswith("load_batch ← train_step") and by_rank[(2,)].outlier
    # Stopped inside the same all_reduce as its peers: its stack alone would not tell it apart, its state does.
    assert by_rank[(4,)].state == "stopped" and by_rank[(4,)].frames == healthy.frames
    lines = verdict.evidence()
    assert lines[0].startswith("stacks: 3 ranks (0, 1, 3) in all_reduce")
    assert any(line.startswith("stacks: rank 2 (n1) in load_batch") and line.endswith("outlier") for line in lines)
    assert any(line.startswith("stacks: rank 4 (n1) stopped in all_reduce") for line in lines)


def test_nobody_is_blamed_when_all_agree_or_nobody_dominates(dumps: list[dict]) -> None:
    healthy = [r for r in dumps if r["rank"] in (0, 1, 3)]
    same = localise(healthy)
    assert same.outliers == [] and len(same.groups) == 1
    assert same.verdict == "all 3 ranks in the same stack: nobody stands out"
    assert same.evidence()[-1] == "stacks: all 3 ranks in the same stack: nobody stands out"
    loader = next(r for r in dumps if r["rank"] == 2)
    split = localise([*healthy[:2], loader, {**loader, "rank": 5, "pid": 1}])  # two against two
    assert split.outliers == []
    assert split.verdict == "no dominant stack among 4 ranks (largest group 2): nobody blamed"
    assert localise([healthy[0], loader]).outliers == []  # two ranks cannot outvote each other


def test_frames_are_normalised_and_the_probe_thread_is_never_the_one(dumps: list[dict]) -> None:
    real = next(r for r in dumps if r["rank"] == 0)
    main = real["threads"][0]
    shimmed = {
        **real,
        "rank": 9,
        "threads": [
            {"name": "trainguard-probe", "active": True, "frames": [{"name": "_send_loop", "filename": "x.py"}]},
            {
                **main,
                "frames": [
                    *({**f, "line": (f["line"] or 0) + 100, "filename": "/elsewhere/" + f["filename"].split("/")[-1]}
                      for f in main["frames"]),
                    {"name": "_run_code", "filename": "/usr/lib/python3.11/runpy.py", "line": 88},
                    {"name": "_call_with_frames_removed", "filename": "<frozen importlib._bootstrap>", "line": 1},
                ],
            },
        ],
    }  # fmt: skip
    # Other line numbers, other directories, interpreter shims, the probe's thread listed first: the same stack.
    assert process_stack(shimmed).frames == process_stack(real).frames


def test_a_malformed_stacks_record_is_dead_lettered_with_the_reason() -> None:
    good = decode("stacks", b'{"ts": 1796205600, "job_id": 7, "node": "n1", "rank": 2, "pid": 5, "threads": []}')
    assert isinstance(good, StacksRecord) and good.job_id == "7"
    bad = decode("stacks", b'{"ts": 1796205600, "job_id": "7", "node": "n1", "threads": [{"frames": [{}]}]}', 0, 12)
    assert isinstance(bad, DeadLetter) and bad.offset == 12
    assert "missing required field `name`" in bad.reason and "$.threads[0].frames[0]" in bad.reason
    nojob = decode("stacks", b'{"ts": 1796205600, "node": "n1"}')
    assert isinstance(nojob, DeadLetter) and "job_id" in nojob.reason


def _hung_job(ranks: int = 5) -> tuple[JobMonitor, float]:
    """A job that stepped every 2 s on every rank until t=1060, then stopped."""
    mon = JobMonitor("7")
    mon.observe(JobEvent(ts=1000.0, job_id="7", state="RUNNING", nodes=["n1"]))
    for step in range(1, 31):
        ts = 1000.0 + 2 * step
        for rank in range(ranks):
            mon.observe(ProgressRecord(ts=ts, job_id="7", node="n1", rank=rank, step=step))
        mon.advance(ts)
    return mon, 1060.0


def _at(records: list[dict], ts: float) -> list[StacksRecord]:
    return [msgspec.convert({**r, "ts": ts}, StacksRecord) for r in records]


def _tick_until(mon: JobMonitor, start: float, end: float) -> list[Anomaly]:
    out: list[Anomaly] = []
    t = start
    while t <= end:
        out += mon.advance(t)
        t += 5.0
    return out


def test_stacks_arriving_on_an_open_hang_republish_it_localised(dumps: list[dict]) -> None:
    mon, last_step = _hung_job()
    (hang,) = [a for a in _tick_until(mon, last_step + 5, last_step + 200) if a.kind == "hang"]
    assert hang.localisation is None and hang.revised_at is None and hang.ranks == []
    for record in _at(dumps, hang.detected_at + 3):
        assert mon.observe(record) == []  # kept until the round settles
    out = _tick_until(mon, hang.detected_at + 5, hang.detected_at + 30)
    (revised,) = out
    assert revised.anomaly_id == hang.anomaly_id and revised.resolved_at is None
    assert (revised.ranks, revised.nodes, revised.localisation) == ([2, 4], ["n1"], "stacks")
    assert revised.revised_at is not None and revised.confidence >= 0.8
    assert revised.evidence[0] == hang.evidence[0]  # what the hang rule saw comes first, then the groups
    assert revised.evidence[1].startswith("stacks: 3 ranks (0, 1, 3) in all_reduce")
    assert [g.ranks for g in revised.stack_groups] == [[0, 1, 3], [2], [4]]
    # The resolution carries what the revision learnt.
    (resolution,) = mon.observe(JobEvent(ts=hang.detected_at + 60, job_id="7", state="CANCELLED"))
    assert resolution.anomaly_id == hang.anomaly_id and resolution.ranks == [2, 4] and resolution.stack_groups


def test_stacks_taken_just_before_the_hang_fires_open_it_localised(dumps: list[dict]) -> None:
    mon, last_step = _hung_job()
    for record in _at(dumps, last_step + 20):  # after the last step, before the deadline
        mon.observe(record)
    (hang,) = [a for a in _tick_until(mon, last_step + 5, last_step + 200) if a.kind == "hang"]
    assert (hang.ranks, hang.localisation, hang.revised_at) == ([2, 4], "stacks", None)  # one record, not two
    # Dumps older than the last step say nothing about the stall.
    mon, last_step = _hung_job()
    for record in _at(dumps, last_step - 30):
        mon.observe(record)
    (hang,) = [a for a in _tick_until(mon, last_step + 5, last_step + 200) if a.kind == "hang"]
    assert hang.localisation is None and hang.stack_groups == []


def test_a_monitor_snapshot_keeps_its_dumps(dumps: list[dict]) -> None:
    import pickle

    mon, last_step = _hung_job()
    for record in _at(dumps, last_step + 20):
        mon.observe(record)
    restored = pickle.loads(pickle.dumps(mon))
    (hang,) = [a for a in _tick_until(restored, last_step + 5, last_step + 200) if a.kind == "hang"]
    assert hang.localisation == "stacks"


def test_stack_records_route_by_job_like_progress(tmp_path: Path) -> None:
    from trainguard.detectors.routing import Router, RouterSettings

    router = Router(RouterSettings(lateness_s=0, tick_s=5))
    record = StacksRecord(ts=100.0, job_id="7", node="n1", rank=0)
    assert ("job/7", record) in router.route("stacks/0", record)
