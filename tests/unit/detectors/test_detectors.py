"""Unit tests of the first detectors: crash grouping, hangs vs benign pauses, stragglers, GPU counters."""

from __future__ import annotations

from trainguard.detectors.events import GpuSample, JobEvent, LogRecord, ProgressRecord
from trainguard.detectors.hang import HangDetector
from trainguard.detectors.monitor import JobMonitor, NodeMonitor
from trainguard.detectors.progress_parsers import parse_progress
from trainguard.detectors.signatures import match_line

TIMEOUT = (
    "[rank{r}]:[E1201 10:21:00.1 ProcessGroupNCCL.cpp:607] [Rank {r}] Watchdog caught collective operation "
    "timeout: WorkNCCL(SeqNum=5, OpType=ALLREDUCE, Timeout(ms)=600000) ran for 600013 milliseconds"
)


def log(ts: float, line: str, rank: int | None = 0, node: str = "n1", job: str | None = "7") -> LogRecord:
    return LogRecord(ts=ts, job_id=job, node=node, rank=rank, line=line)


def steps(mon: JobMonitor, start: float, count: int, every: float, first_step: int = 1) -> float:
    ts = start
    for i in range(count):
        ts = start + i * every
        mon.observe(ProgressRecord(ts=ts, job_id="7", node="n1", rank=0, step=first_step + i))
    return ts


def test_cascade_of_timeouts_waits_for_a_root_error_and_becomes_one_anomaly():
    mon = JobMonitor("7")
    assert mon.observe(log(100.0, TIMEOUT.format(r=0))) == []
    assert mon.observe(log(100.1, TIMEOUT.format(r=1), rank=1)) == []
    root = mon.observe(
        log(101.0, "NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus.", rank=None, node="n2")
    )
    assert [(a.category, a.nodes, a.layer) for a in root] == [("xid_79", ["n2"], "hardware")]
    assert any("Watchdog" in e for e in root[0].evidence)
    # Later cascade lines and the scheduler's FAILED join the same incident.
    assert mon.observe(log(700.0, TIMEOUT.format(r=5), rank=5)) == []
    assert mon.advance(800.0) == []
    ended = mon.observe(JobEvent(ts=705.0, job_id="7", state="FAILED", nodes=["n1", "n2"]))
    assert [(a.anomaly_id, a.resolution) for a in ended] == [(root[0].anomaly_id, "job ended (FAILED)")]


def test_cascade_alone_is_reported_after_the_hold_as_a_system_fault():
    mon = JobMonitor("7")
    mon.observe(log(100.0, TIMEOUT.format(r=0)))
    assert mon.advance(105.0) == []
    found = mon.advance(110.0)
    assert [(a.category, a.layer, a.transient, a.detected_at) for a in found] == [
        ("nccl_timeout", "system", True, 110.0)
    ]


def test_a_new_run_after_restart_is_a_new_incident():
    mon = JobMonitor("7")
    first = mon.observe(log(100.0, "RuntimeError: CUDA error: an illegal memory access was encountered"))
    mon.observe(JobEvent(ts=200.0, job_id="7", state="RUNNING", nodes=["n1"]))
    second = mon.observe(log(300.0, "RuntimeError: CUDA error: an illegal memory access was encountered"))
    assert len(first) == len(second) == 1 and first[0].anomaly_id != second[0].anomaly_id


def test_hang_fires_after_learned_deadline_and_localises_the_rank_that_stopped_first():
    det = HangDetector(floor_s=55, warmup_steps=2)
    for step in range(1, 20):
        for rank in range(4):
            if rank == 2 and step > 10:
                continue  # rank 2 stopped early
            det.observe_progress(ts=1000.0 + step * 2 + rank * 0.01, step=step, rank=rank, node=f"n{rank // 2}")
    assert det.deadline() == 1038.0 + 55  # from the first report of the newest step
    assert det.advance(1090.0) is None
    finding = det.advance(1095.0)
    assert finding is not None and finding.ranks == [2] and finding.nodes == ["n1"]
    assert det.advance(2000.0) is None  # once per stall


def test_checkpoint_and_eval_pauses_are_not_hangs_but_a_stuck_checkpoint_is():
    mon = JobMonitor("7")
    last = steps(mon, 0.0, 30, 2.0)
    mon.observe(log(last + 0.5, "saving checkpoint at iteration 30 to /ckpt"))
    assert mon.advance(last + 300.0) == []
    mon.observe(log(last + 400.0, "successfully saved checkpoint at iteration 30"))
    last = steps(mon, last + 402.0, 10, 2.0, first_step=31)
    mon.observe(log(last + 0.5, "Running Evaluation"))
    assert mon.advance(last + 600.0) == []
    mon.observe(log(last + 610.0, "evaluation done"))
    last = steps(mon, last + 612.0, 10, 2.0, first_step=41)
    mon.observe(log(last + 0.5, "saving checkpoint at iteration 50"))
    assert mon.advance(last + 800.0) == []
    stuck = mon.advance(last + 905.0)
    assert [a.kind for a in stuck] == ["hang"] and any("never ended" in e for e in stuck[0].evidence)


def test_warm_up_gets_the_startup_grace_and_user_cancel_disarms():
    mon = JobMonitor("7")
    mon.observe(JobEvent(ts=0.0, job_id="7", state="RUNNING", nodes=["n1"]))
    assert mon.advance(500.0) == []  # no step yet: compiling, loading data
    assert [a.kind for a in mon.advance(600.0)] == ["hang"]
    mon2 = JobMonitor("8")
    steps(mon2, 0.0, 20, 1.0)
    mon2.observe(JobEvent(ts=25.0, job_id="8", state="CANCELLED", nodes=["n1"]))
    assert mon2.advance(5000.0) == []
    assert mon2.finished(25.0 + 601.0)


def test_straggler_needs_a_sustained_rise_and_names_the_slow_rank():
    mon = JobMonitor("7")
    ts, found = 0.0, []
    for step in range(1, 81):
        slow = 30 <= step < 33 or step >= 60  # a 3-step blip is not a straggler; from step 60 rank 5 is slow
        step_time = 1.6 if slow else 1.0
        ts += step_time
        for rank in range(8):
            compute = 0.7 * (1.6 if rank == 5 and slow else 1.0)
            found += mon.observe(
                ProgressRecord(
                    ts=ts + rank * 0.001,
                    job_id="7",
                    node=f"n{rank // 4}",
                    rank=rank,
                    step=step,
                    step_time_s=step_time,
                    compute_time_s=compute,
                )
            )
    assert [(a.kind, a.category, a.ranks, a.nodes) for a in found] == [("straggler", "slow_rank", [5], ["n1"])]
    assert found[0].onset_ts >= 60.0 * 1.0


def test_gpu_health_uses_counter_deltas_and_survives_resets():
    mon = NodeMonitor("n1")
    sample = dict(node="n1", gpu=0, ecc_sbe_total=5, ecc_dbe_total=3)
    assert mon.observe(GpuSample(ts=0.0, **sample)) == []  # a high counter alone is history
    assert mon.observe(GpuSample(ts=10.0, **{**sample, "ecc_dbe_total": 0})) == []  # driver reload reset
    found = mon.observe(GpuSample(ts=20.0, **{**sample, "ecc_dbe_total": 1}))
    assert [(a.kind, a.category) for a in found] == [("node_unhealthy", "ecc_dbe")]  # no job: act on the node
    busy = mon.observe(
        GpuSample(ts=30.0, **{**sample, "gpu": 1, "ecc_dbe_total": 0, "remapped_rows_pending": 2, "job_id": "9"})
    )
    assert [(a.kind, a.category, a.job_id) for a in busy] == [("gpu_degraded", "row_remap_pending", "9")]


def test_signatures_and_parsers_on_a_few_real_formats():
    assert (
        match_line("torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.70 GiB").signature.category
        == "oom"
    )
    assert (
        match_line("NCCL WARN NET/IB : Got completion from peer 10.0.0.1<5> with status=12 opcode=0").signature.category
        == "ib_link"
    )
    assert match_line("[default7]: iteration 12695/ 115311 | lm loss: 2.46 | number of nan iterations: 0 |") is None
    mega = parse_progress(
        " [default7]: iteration    12695/  115311 | consumed samples:      9841584 | "
        "elapsed time per iteration (s): 105.22 | samples per second: 19.463 |"
    )
    assert mega is not None and mega.step == 12695 and mega.step_time_s == 105.22 and mega.samples_per_s == 19.463
    assert parse_progress('{"step": 12, "tokens_per_s": 1500.5, "loss": 2.1}').tokens_per_s == 1500.5
    assert parse_progress('{"loss": 2.1}') is None


def test_a_gpu_is_named_node_slash_index_everywhere_once_its_telemetry_gives_its_pci_address():
    xid = "NVRM: Xid (PCI:0000:4b:00): 79, pid=1, GPU has fallen off the bus."
    blind = JobMonitor("7")
    (only_logs,) = blind.observe(log(100.0, xid, rank=None, node="n2"))
    assert only_logs.gpus == ["n2/0000:4b:00"]  # no telemetry: the PCI address stands in for the index
    mon = JobMonitor("7")
    for gpu in range(4):
        pci = f"00000000:{0x1B + 0x10 * gpu:02X}:00.0"  # NVML's form; gpu 3 is at 4B
        mon.observe(GpuSample(ts=90.0, job_id="7", node="n2", gpu=gpu, pci_bus_id=pci, util_pct=99.0, power_w=500.0))
    (named,) = mon.observe(log(100.0, xid, rank=None, node="n2"))
    assert named.gpus == ["n2/3"] and any("PCI:0000:4b:00" in e for e in named.evidence)
    node = NodeMonitor("n2")
    node.observe(GpuSample(ts=90.0, node="n2", gpu=3, pci_bus_id="00000000:4B:00.0", util_pct=0.0))
    (idle,) = node.observe(log(100.0, xid, rank=None, node="n2", job=None))
    assert idle.gpus == ["n2/3"]


def test_a_malformed_pci_bus_id_in_telemetry_is_kept_as_written_and_a_wrong_type_is_a_dead_letter():
    from trainguard.detectors.events import DeadLetter, decode

    mon = JobMonitor("7")
    for pci in ("zz:yy:xx", "", "garbage"):  # untrusted telemetry never stops the monitor
        mon.observe(GpuSample(ts=90.0, job_id="7", node="n2", gpu=0, pci_bus_id=pci, util_pct=99.0))
    (found,) = mon.observe(
        log(100.0, "NVRM: Xid (PCI:0000:4b:00): 79, pid=1, GPU has fallen off the bus.", rank=None, node="n2")
    )
    assert found.gpus == ["n2/0000:4b:00"]
    payload = b'{"ts": 1796205600, "node": "n2", "gpu": 0, "pci_bus_id": 5}'
    dead = decode("gpu", payload)
    assert isinstance(dead, DeadLetter) and "pci_bus_id" in dead.reason and dead.payload == payload
