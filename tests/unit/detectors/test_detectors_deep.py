"""Localisation and health: real PAI straggler traces, GPU peer comparison, numerics, NVRx reports, GPU counters."""

from __future__ import annotations

import csv

import pytest

from tests.support.paths import reference_data
from trainguard.detectors.events import GpuSample, LogRecord, ProgressRecord
from trainguard.detectors.monitor import JobMonitor, NodeMonitor

T0 = 1_796_000_000.0


def pai_anomalies(job: int) -> list:
    """Replay a PAI trace's per-worker mini-batch times as per-rank progress of one job."""
    name = f"job_{job}_norm.csv"
    path = reference_data(f"alibaba-pai2020-minibatch/data/{name}", f"alibaba-pai2020-minibatch/{name}")
    if not path.is_file():
        pytest.skip(f"PAI trace not found at {path} (shared/datasets is beside the checkout)")
    mon = JobMonitor(f"pai{job}")
    found = []
    with path.open() as fh:
        rows = sorted(csv.DictReader(fh), key=lambda r: (float(r["time"]), int(r["worker"])))
    for row in rows:
        t, worker = float(row["time"]), int(row["worker"])
        found += mon.observe(
            ProgressRecord(
                ts=T0 + t,
                job_id=f"pai{job}",
                node=f"worker-{worker}",
                rank=worker,
                step=int(t),
                step_time_s=float(row["batch_time_norm"]) / 1000,
            )
        )
    return found


def test_pai_job1_worker6_is_found_and_named_and_calm_stretches_stay_quiet():
    found = pai_anomalies(1)
    assert [(a.kind, a.ranks, a.nodes) for a in found] == [("straggler", [6], ["worker-6"])]
    onset, detected = found[0].onset_ts - T0, found[0].detected_at - T0
    assert 1811 <= onset <= 1941 and detected <= 1941


@pytest.mark.parametrize("job", [2, 3])
def test_pai_jobs_without_a_labelled_straggler_raise_nothing(job: int):
    assert pai_anomalies(job) == []


def feed(mon: JobMonitor, records: list) -> list:
    return [anomaly for record in records for anomaly in mon.observe(record)]


def gpu(ts: float, node: str, g: int, **kw) -> GpuSample:
    base = dict(util_pct=99.0, temp_c=65.0, power_w=560.0, sm_clock_mhz=1980.0, throttle_reasons=0)
    return GpuSample(ts=ts, node=node, gpu=g, **{**base, **kw})


def test_job_slowdown_without_rank_timings_is_pinned_on_the_odd_gpu():
    mon = JobMonitor("9")
    ts, found = 0.0, []
    for step in range(1, 80):
        slow = step >= 50
        ts += 1.5 if slow else 1.0
        found += mon.observe(
            LogRecord(
                ts=ts,
                job_id="9",
                node="n0",
                rank=0,
                line=f"iteration {step}/ 1000 | elapsed time per iteration (ms): {1500.0 if slow else 1000.0} |",
            )
        )
        if step % 10 == 0:
            for node in ("n0", "n1"):
                for g in range(8):
                    hot = slow and node == "n1" and g == 5
                    found += mon.observe(
                        gpu(
                            ts,
                            node,
                            g,
                            sm_clock_mhz=1400.0 if hot else 1980.0,
                            temp_c=88.0 if hot else 65.0,
                            throttle_reasons=0x20 if hot else 0,
                        )
                    )
    stragglers = [a for a in found if a.kind == "straggler"]
    assert [(a.category, a.nodes, a.gpus) for a in stragglers] == [("slow_gpu", ["n1"], ["n1/5"])]


def test_nan_loss_in_progress_lines_is_reported_once():
    mon = JobMonitor("3")
    found = []
    for step in range(1, 6):
        found += mon.observe(
            LogRecord(
                ts=float(step),
                job_id="3",
                node="n",
                rank=0,
                line=(
                    f" iteration {step}/ 250000 | elapsed time per iteration (ms): 4247.9 | lm loss: 2.1E+00 | "
                    f"grad norm: {'nan' if step > 2 else '0.3'} | number of nan iterations:   0 |"
                ),
            )
        )
    assert [(a.kind, a.category, a.layer) for a in found] == [("numerics", "nan_loss", "application")]


def test_loss_scale_overflows_matter_only_as_a_storm():
    line = "[INFO] [loss_scaler.py:190:update_scale] [deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale"
    calm = JobMonitor("1")
    assert feed(calm, [LogRecord(ts=float(i * 30), job_id="1", node="n", line=line) for i in range(10)]) == []
    storm = JobMonitor("2")
    found = feed(storm, [LogRecord(ts=float(i), job_id="2", node="n", line=line) for i in range(40)])
    assert [(a.kind, a.category) for a in found] == [("numerics", "nan_loss")]


def test_nvrx_report_below_threshold_names_the_rank():
    mon = JobMonitor("4")
    lines = [
        "megatron.bridge.NVRxStragglerDetection: GPU relative performance:",
        "  Rank=0 Node=hostA Score=0.97",
        "  Rank=1 Node=hostB Score=0.52",
    ]
    found = feed(mon, [LogRecord(ts=10.0 + i, job_id="4", node="hostA", line=x) for i, x in enumerate(lines)])
    assert [(a.kind, a.ranks, a.nodes) for a in found] == [("straggler", [1], ["hostB"])]


def test_hf_trainer_dicts_count_as_progress():
    mon = JobMonitor("5")
    for i in range(20):
        mon.observe(LogRecord(ts=float(i * 10), job_id="5", node="n", line=f"{{'loss': 2.{i}, 'epoch': 0.{i}}}"))
    assert mon.advance(200.0) == []  # stepping every 10 s: no hang 10 s later
    assert [a.kind for a in mon.advance(260.0)] == ["hang"]


def test_idle_node_counter_bursts_throttling_and_a_lost_gpu():
    mon = NodeMonitor("n7")
    found = []
    for i in range(12):
        ts = i * 10.0
        for g in range(4):
            if g == 2 and i >= 3:
                continue  # GPU 2 falls off the bus
            found += mon.observe(
                GpuSample(
                    ts=ts,
                    node="n7",
                    gpu=g,
                    util_pct=0.0,
                    ecc_sbe_total=10 + (i * 40 if g == 0 else 0),
                    pcie_replay_total=(1000 + i * 5 if i < 4 else (i - 4) * 5) if g == 1 else 0,  # driver reload at i=4
                    nvlink_crc_total=i * 30 if g == 3 else 0,
                    throttle_reasons=0x80 if g == 3 else 0,
                )
            )
        found += mon.advance(ts)
    got = sorted((a.kind, a.category, tuple(a.gpus)) for a in found)
    assert got == [
        ("node_unhealthy", "ecc_sbe_burst", ("n7/0",)),
        ("node_unhealthy", "gpu_lost", ("n7/2",)),
        ("node_unhealthy", "nvlink_crc_burst", ("n7/3",)),
        ("node_unhealthy", "power_brake", ("n7/3",)),
    ]  # g1's PCIe counter reset at i=4 is not a burst
    lost = next(a for a in found if a.category == "gpu_lost")
    assert lost.onset_ts == 20.0  # last seen


def test_a_burst_begins_where_its_climb_began_not_at_a_stray_error_earlier_in_the_window():
    from trainguard.detectors.gpu_health import GpuHealth

    health = GpuHealth()
    totals = [5] * 10 + [6] * 30 + [6 + 30 * k for k in range(1, 6)]  # a stray error at 100 s, the climb from 400 s
    found = [f for i, total in enumerate(totals) for f in health.observe(gpu(i * 10.0, "n1", 0, ecc_sbe_total=total))]
    (burst,) = [f for f in found if f.category == "ecc_sbe_burst"]
    assert burst.onset_ts == 400.0  # the first sample of the climb, not the stray one at 100 s
    spread = GpuHealth()  # a slow climb over the whole window (a change every 70 s) began at its first change
    found = [f for i in range(60) for f in spread.observe(gpu(i * 10.0, "n1", 0, ecc_sbe_total=10 + 14 * (i // 7)))]
    (burst,) = [f for f in found if f.category == "ecc_sbe_burst"]
    assert burst.onset_ts == 70.0


def test_gpu_lost_during_a_job_joins_the_crash_incident():
    mon = JobMonitor("6")
    found = mon.observe(
        LogRecord(
            ts=100.0,
            job_id="6",
            node="n1",
            source="kernel",
            line="NVRM: Xid (PCI:0000:4b:00): 79, pid=1, GPU has fallen off the bus.",
        )
    )
    for i in range(12):
        for g in range(8):
            if g == 3 and i >= 10:
                continue
            found += mon.observe(gpu(i * 10.0, "n1", g))
        found += mon.advance(i * 10.0 + 90)
    assert [(a.kind, a.category) for a in found] == [("crash", "xid_79")]


def test_idle_gpu_temperature_excursion_is_novel_but_idle_noise_is_not():
    mon = NodeMonitor("n8")
    found = []
    for i in range(400):
        temp = 34.0 + (i * 7919 % 13) / 10.0  # idle jitter between 34.0 and 35.2 °C
        if i >= 300:
            temp = 52.0  # an idle GPU suddenly 17 °C warmer: a fan or heatsink is failing
        found += mon.observe(GpuSample(ts=i * 10.0, node="n8", gpu=0, util_pct=0.0, temp_c=temp, power_w=70.0))
    assert [(a.kind, a.category, a.onset_ts) for a in found] == [("node_unhealthy", "idle_temp_drift", 3000.0)]


def test_a_slowdown_after_a_nic_link_degradation_is_pinned_on_that_node():
    mon = JobMonitor("12")
    nic = "mlx5_core 0000:5e:00.0: Port 1 link speed degraded: 400000 Mb/s -> 100000 Mb/s"
    ts, found = 0.0, []
    for step in range(1, 80):
        slow = step >= 50
        if step == 50:
            found += mon.observe(LogRecord(ts=ts, job_id="12", node="n1", source="kernel", line=nic))
            assert found == []  # a degraded link alone is evidence, not an alarm
        ts += 1.8 if slow else 1.0
        found += mon.observe(
            LogRecord(
                ts=ts,
                job_id="12",
                node="n0",
                rank=0,
                line=(f"iteration {step}/ 1000 | elapsed time per iteration (ms): {1800.0 if slow else 1000.0} |"),
            )
        )
    assert [(a.kind, a.category, a.nodes, a.layer) for a in found] == [("straggler", "slow_nic", ["n1"], "hardware")]
