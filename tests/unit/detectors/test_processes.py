"""Processes of a real job: a rank that stops beating, a worker killed by a signal, a stop on request.

The lines are as torch 2.13's torchelastic and gloo printed them in the real-job tests
(tests/integration/test_realjob.py); the probe records are the probe's own (steps, beats, pids).
"""

from __future__ import annotations

from trainguard.detectors.events import Anomaly, LogRecord, ProgressRecord
from trainguard.detectors.monitor import JobMonitor

T0 = 1_796_400_000.0
AGENT = "torch/distributed/elastic/multiprocessing/api.py"
KILLED = f"E1204 17:51:01.154000 5102 {AGENT}:1002] failed (exitcode: -9) local_rank: 2 (pid: 5109) of binary: python3"
RESET = (
    "[rank1]: RuntimeError: [/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:537] Read error "
    "[127.0.0.1]:18844: Connection reset by peer. This is typically caused by a remote worker hanging"
)
TERM = (
    "W1204 17:52:13.506000 5374 torch/distributed/elastic/agent/server/api.py:753] "
    "Received 15 death signal, shutting down workers"
)


def run(mon: JobMonitor, steps: int = 40, ranks: int = 4, beat_until: float | None = None, silent: int = 2) -> list:
    """Steps every 0.25 s on every rank; then (``beat_until``) every rank but ``silent`` beats every 5 s, with
    the clock ticking every 5 s. Returns the anomalies opened."""
    out: list[Anomaly] = []
    t = T0
    for step in range(1, steps + 1):
        t = T0 + 0.25 * step
        for rank in range(ranks):
            out += mon.observe(ProgressRecord(ts=t, job_id="9", node="n1", rank=rank, step=step, pid=5100 + rank))
    last = t
    if beat_until is not None:
        now = last
        while now < beat_until:
            now += 5.0
            for rank in range(ranks):
                if rank != silent:
                    out += mon.observe(
                        ProgressRecord(ts=now, job_id="9", node="n1", rank=rank, step=steps, pid=5100 + rank, beat=True)
                    )
            out += mon.advance(now)
    return [a for a in out if a.resolved_at is None]


def log(mon: JobMonitor, ts: float, line: str, rank: int | None = None) -> list:
    return mon.observe(LogRecord(ts=ts, job_id="9", node="n1", rank=rank, line=line))


def test_a_rank_that_stops_beating_while_its_peers_wait_is_the_hang_named_at_once():
    mon = JobMonitor("9")
    found = run(mon, beat_until=T0 + 10 + 40)
    hangs = [a for a in found if a.kind == "hang"]
    assert len(hangs) == 1
    hang = hangs[0]
    assert (hang.ranks, hang.nodes, hang.localisation) == ([2], ["n1"], "heartbeats")
    assert hang.detected_at - hang.onset_ts <= 25.0  # not the 55 s floor of a logs-only job
    assert any("rank 2 on n1 has sent nothing" in e for e in hang.evidence)


def test_without_beats_the_logs_only_deadline_holds_and_nobody_is_blamed_for_silence():
    mon = JobMonitor("9")
    found = run(mon)
    for now in range(5, 80, 5):
        found += mon.advance(T0 + 10 + now)
    (hang,) = [a for a in found if a.kind == "hang"]
    assert hang.detected_at - hang.onset_ts >= 55.0 and hang.localisation != "heartbeats"


def test_a_marked_checkpoint_is_no_silent_rank_even_when_the_writer_beats_late():
    mon = JobMonitor("9")
    run(mon, steps=40)
    log(
        mon,
        T0 + 10.1,
        "[titan] 2026-12-04 10:00:10,100 - root - INFO - Saving the checkpoint (or staging if async is enabled).",
        rank=0,
    )
    found = []
    for k in range(1, 13):  # rank 2's process is busy writing for a minute, its beats late; the others beat
        now = T0 + 10 + 5 * k
        for rank in (0, 1, 3):
            found += mon.observe(ProgressRecord(ts=now, job_id="9", node="n1", rank=rank, step=40, beat=True))
        found += mon.advance(now)
    assert [a for a in found if a.kind == "hang"] == []


def test_a_worker_killed_by_a_signal_is_the_root_cause_named_by_its_pid():
    mon = JobMonitor("9")
    run(mon, ranks=4)  # pids 5100..5103: the launcher's "pid 5102" is rank 2, whatever its local rank says
    t = T0 + 10.5
    assert log(mon, t, RESET, rank=1) == []  # a survivor's cascade: held
    line = KILLED.replace("pid: 5109", "pid: 5102").replace("local_rank: 2", "local_rank: 0")
    (crash,) = log(mon, t + 0.1, line)
    assert (crash.kind, crash.category, crash.ranks) == ("crash", "process_crash", [2])
    assert "exit code -9: killed by SIGKILL" in crash.evidence
    assert any("Connection reset by peer" in e for e in crash.evidence)  # the held cascade, as evidence
    summary = "  exitcode  : -9 (pid: 5102)  (SIGKILL)"
    assert log(mon, t + 0.3, "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ") == []
    assert log(mon, t + 0.3, summary) == []  # torchelastic's summary joins the incident
    assert mon.advance(t + 30) == []


def test_on_one_node_the_local_rank_names_a_killed_worker_the_probe_never_reported():
    mon = JobMonitor("9")
    (crash,) = log(mon, T0, KILLED)
    assert crash.ranks == [2]


def test_a_worker_killed_after_a_hang_was_raised_is_its_aftermath():
    mon = JobMonitor("9")
    found = run(mon, beat_until=T0 + 10 + 40)
    assert [a.kind for a in found] == ["hang"]
    later = log(mon, T0 + 120, KILLED.replace("pid: 5109", "pid: 5102"))
    assert later == []  # torchelastic killed the stopped rank once the others had timed out: the same incident


def test_a_job_stopped_on_request_ends_and_its_shutdown_noise_raises_nothing():
    mon = JobMonitor("9")
    run(mon)
    t = T0 + 10.4
    found = log(mon, t, TERM)
    found += log(mon, t + 0.01, RESET, rank=1)
    found += log(
        mon, t + 0.2, "torch.distributed.elastic.multiprocessing.api.SignalException: Process 5374 got signal: 15"
    )
    found += log(mon, t + 30.3, KILLED.replace("pid: 5109", "pid: 5101"))  # a worker that ignored SIGTERM
    for now in range(5, 120, 5):
        found += mon.advance(t + now)
    assert found == []
    assert mon.ended_at == t


def test_the_same_stop_after_a_failure_is_the_failures_aftermath():
    mon = JobMonitor("9")
    run(mon)
    t = T0 + 10.4
    log(mon, t, "srun: error: gpu-node-02: task 1: Exited with exit code 1")  # held: a cascade
    found = log(mon, t + 1, TERM)
    for now in range(5, 30, 5):
        found += mon.advance(t + now)
    assert [a.kind for a in found] == ["crash"]


def test_a_session_that_hung_up_is_no_request():
    mon = JobMonitor("9")
    run(mon)
    t = T0 + 10.4
    found = log(mon, t, TERM.replace("Received 15", "Received 1"))
    for now in range(5, 30, 5):
        found += mon.advance(t + now)
    assert [a.kind for a in found] == ["crash"] and mon.ended_at is None
