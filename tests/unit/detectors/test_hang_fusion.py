"""Hang judgement that fuses GPU state and learns the job's rhythm (benign pauses stay silent)."""

from __future__ import annotations

from trainguard.detectors.events import GpuSample, JobEvent, LogRecord, ProgressRecord
from trainguard.detectors.hang import HangDetector, parse_rhythm
from trainguard.detectors.monitor import JobMonitor

NODES = ["n1", "n2"]


def _job(step_s: float = 2.0, steps: int = 60, gpu: bool = True) -> tuple[JobMonitor, float]:
    """A job that trained ``steps`` steps with GPU samples every 10 s; returns it and its last step time."""
    mon = JobMonitor("7")
    mon.observe(JobEvent(ts=0.0, job_id="7", state="RUNNING", nodes=NODES))
    t = 0.0
    next_sample = 0.0
    for step in range(1, steps + 1):
        t = 30.0 + step * step_s
        while gpu and next_sample <= t:
            _samples(mon, next_sample, util=98.0, power=560.0)
            next_sample += 10.0
        mon.observe(ProgressRecord(ts=t, job_id="7", node="n1", rank=0, step=step))
        mon.advance(t)
    return mon, t


def _samples(mon: JobMonitor, ts: float, util: float, power: float, idle: tuple[str, int] | None = None) -> None:
    for node in NODES:
        for g in range(4):
            busy = (node, g) != idle
            mon.observe(
                GpuSample(ts=ts, node=node, gpu=g, util_pct=util if busy else 0.0, power_w=power if busy else 70.0)
            )


def _silence(
    mon: JobMonitor,
    start: float,
    seconds: float,
    util: float | None,
    power: float = 0.0,
    idle: tuple[str, int] | None = None,
) -> list:
    """No step for ``seconds``; GPU samples every 10 s with the given profile (None: no telemetry)."""
    found = []
    t = start
    while t <= start + seconds:
        if util is not None and round(t - start) % 10 == 0:
            _samples(mon, t, util, power, idle)
        found += [a for a in mon.advance(t) if not a.resolved]
        t += 5.0
    return found


def test_gpus_spinning_in_nccl_confirm_a_hang_within_30_seconds() -> None:
    mon, last = _job()
    (hang,) = _silence(mon, last + 5.0, 120.0, util=100.0, power=150.0)
    assert hang.category == "no_progress" and hang.detected_at - last <= 30.0
    assert any("spinning in NCCL" in e for e in hang.evidence)


def test_one_gpu_idle_while_its_peers_spin_is_the_culprit() -> None:
    mon, last = _job()
    (hang,) = _silence(mon, last + 5.0, 120.0, util=100.0, power=150.0, idle=("n2", 3))
    assert hang.detected_at - last <= 30.0 and hang.gpus == ["n2/3"] and hang.nodes == ["n2"]


def test_an_evaluation_with_busy_gpus_and_no_marker_is_not_a_hang() -> None:
    mon, last = _job()
    assert _silence(mon, last + 5.0, 180.0, util=95.0, power=480.0) == []  # 3 minutes of forward passes
    mon.observe(ProgressRecord(ts=last + 190.0, job_id="7", node="n1", rank=0, step=61))


def test_a_checkpoint_with_idle_gpus_after_a_save_marker_is_not_a_hang() -> None:
    mon, last = _job()
    mon.observe(LogRecord(ts=last + 1.0, job_id="7", node="n1", rank=0, line="saving checkpoint at iteration 60"))
    assert _silence(mon, last + 5.0, 240.0, util=0.0, power=70.0) == []  # 4 minutes of writing


def test_logs_only_a_stall_at_a_printed_interval_waits_and_elsewhere_fires_at_the_floor() -> None:
    mon, last = _job(gpu=False)
    (hang,) = _silence(mon, last + 5.0, 120.0, util=None)  # step 60 is no multiple of anything known
    assert 55.0 <= hang.detected_at - last <= 65.0
    mon, last = _job(gpu=False)
    mon.observe(LogRecord(ts=1.0, job_id="7", node="n1", rank=0, line="  eval_interval ................. 20"))
    assert _silence(mon, last + 5.0, 300.0, util=None) == []  # step 60 is a multiple of eval_interval 20


def test_the_rhythm_of_earlier_pauses_is_learned() -> None:
    det = HangDetector(floor_s=55.0, warmup_steps=3)
    t = 0.0
    for step in range(1, 1601):
        t += 2.0
        if step - 1 in (500, 1000):
            t += 150.0  # an evaluation after steps 500 and 1000
        det.observe_progress(t, step, 0, "n1")
        if step == 1500:
            break
    assert det.expected_pause() is not None and "period of the job's earlier pauses (500)" in det.expected_pause()


def test_intervals_printed_by_several_frameworks_are_read() -> None:
    assert parse_rhythm("  save_interval ................................... 500") == ("save_interval", 500)
    assert parse_rhythm("eval_steps=250,") == ("eval_steps", 250)
    assert parse_rhythm("trainer: val_check_interval: 1000") == ("val_check_interval", 1000)
    assert parse_rhythm("iteration 10 | lm loss 2.0") is None
