"""A node's GPU samples judged as one frame say exactly what the same samples say one by one."""

from __future__ import annotations

import pickle
import random

import pytest

from trainguard.detectors.events import GpuSample
from trainguard.detectors.frames import GpuFrame
from trainguard.detectors.gpu_activity import GpuActivity
from trainguard.detectors.gpu_health import GpuHealth
from trainguard.detectors.gpu_peers import GpuPeers


def _rounds(seed: int, rounds: int = 240) -> list[list[GpuSample]]:
    """Sweeps of two 4-GPU nodes with counters that creep and jump, Xids, throttling, remaps, missing
    fields and a GPU that falls off the bus — what the GPU rules look at."""
    rng = random.Random(seed)
    counters = {(n, g): [rng.randint(0, 5), 0, 0, 0] for n in ("a", "b") for g in range(4)}
    sweeps = []
    for r in range(rounds):
        for node in ("a", "b"):
            sweep = []
            for g in range(4):
                if node == "b" and g == 3 and 100 <= r < 160:
                    continue  # fallen off the bus for a while
                c = counters[(node, g)]
                if rng.random() < 0.05:
                    c[0] += rng.choice((1, 40, 150))
                if rng.random() < 0.01:
                    c[1] += 1
                if rng.random() < 0.005:
                    c[:] = [0, 0, 0, 0]  # driver reload
                idle = rng.random() < 0.2
                sweep.append(
                    GpuSample(
                        ts=1_796_119_200.0 + 10 * r,
                        node=node,
                        gpu=g,
                        util_pct=None if rng.random() < 0.02 else (0.0 if idle else rng.uniform(90, 100)),
                        power_w=rng.uniform(60, 80) if idle else rng.uniform(150, 600),
                        temp_c=rng.uniform(30, 80),
                        sm_clock_mhz=rng.choice((1410.0, 1980.0)),
                        ecc_sbe_total=c[0],
                        ecc_dbe_total=c[1],
                        pcie_replay_total=c[2] + (r // 50) * 120 * (node == "a" and g == 1),
                        nvlink_crc_total=None if g == 2 else c[3],
                        throttle_reasons=rng.choice((0, 0, 0, 0x20, ["hw_power_brake_slowdown"])),
                        remapped_rows_pending=1 if rng.random() < 0.01 else 0,
                        xid=rng.choice((None,) * 60 + (79, 43, 48, 63)),
                        pci_bus_id=f"00000000:{g:02X}:00.0",
                    )
                )
            sweeps.append(sweep)
    return sweeps


def _said(findings: list) -> list[tuple]:
    return [(f.category, f.kind, f.gpus, f.detected_at, f.onset_ts, f.severity, tuple(f.evidence)) for f in findings]


@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize("idle_drift", [False, True])
def test_health_says_the_same_of_a_frame_as_of_its_samples(seed: int, idle_drift: bool):
    one_by_one, framed = GpuHealth(idle_drift=idle_drift), GpuHealth(idle_drift=idle_drift)
    said_alone: list = []
    said_framed: list = []
    for sweep in _rounds(seed):
        for sample in sweep:
            said_alone += one_by_one.observe(sample)
        said_framed += framed.observe(GpuFrame.from_samples(sweep))
    assert said_alone, "the scenario must give the rules something to say"
    assert _said(said_framed) == _said(said_alone)
    assert {f.category for f in said_alone} >= {"ecc_dbe", "ecc_sbe_burst", "row_remap_pending", "xid_79"}


def test_peers_and_activity_see_the_same_in_frames():
    alone, framed = (GpuPeers(), GpuActivity()), (GpuPeers(), GpuActivity())
    for i, sweep in enumerate(_rounds(4, rounds=180)):
        stepping = i < 200
        for sample in sweep:
            alone[0].observe(sample)
            alone[1].observe(sample, stepping)
        framed[0].observe(GpuFrame.from_samples(sweep))
        framed[1].observe(GpuFrame.from_samples(sweep), stepping)
    now = 1_796_119_200.0 + 10 * 180
    assert framed[0].missing(now, 60.0) == alone[0].missing(now, 60.0)
    assert framed[0].odd_one_out() == alone[0].odd_one_out()
    assert framed[0].idle_while_peers_spin() == alone[0].idle_while_peers_spin()
    assert framed[1].verdict(since=now - 60) == alone[1].verdict(since=now - 60)
    assert framed[1].train_power == alone[1].train_power


def test_a_frame_row_is_the_record_it_came_from():
    sweep = _rounds(5, rounds=1)[0]
    frame = GpuFrame.from_samples(sweep)
    again = list(frame.samples())
    for before, after in zip(sweep, again, strict=True):
        fields = {f: getattr(before, f) for f in before.__struct_fields__}
        if isinstance(fields["throttle_reasons"], list):
            fields["throttle_reasons"] = 0x80  # reason names read as the bitmask they mean
        assert {f: getattr(after, f) for f in after.__struct_fields__} == fields
    assert type(again[0].ecc_sbe_total) is int and type(again[0].util_pct) in (float, type(None))
    restored = pickle.loads(pickle.dumps(frame))
    assert (restored.gpus, restored.values.tobytes(), restored.rare) == (frame.gpus, frame.values.tobytes(), frame.rare)


def test_a_frame_is_rare_only_when_a_sample_is_news_on_its_own():
    quiet = [GpuSample(ts=1.0, node="n", gpu=g, util_pct=99.0, throttle_reasons=0x4) for g in range(8)]
    assert not GpuFrame.from_samples(quiet).rare  # the routine power cap is not news
    for news in (
        {"xid": 79},
        {"remapped_rows_failed": 1},
        {"throttle_reasons": 0x40},
        {"throttle_reasons": ["sw_thermal"]},
    ):
        assert GpuFrame.from_samples([*quiet[:7], GpuSample(ts=1.0, node="n", gpu=7, **news)]).rare, news


def test_a_refused_frame_is_a_dead_letter_per_gpu_record():
    from trainguard.detectors.events import decode
    from trainguard.detectors.routing import DEAD, Router, RouterSettings

    router = Router(RouterSettings(lateness_s=0, max_future_s=60))
    router.route("gpu/0", GpuSample(ts=1_796_119_200.0, node="n", gpu=0))
    far = GpuFrame.from_samples([GpuSample(ts=1_796_129_200.0, node="n", gpu=g, xid=79) for g in range(4)])
    out = router.route("gpu/0", far, order=(2, 0, 10))  # type: ignore[arg-type]
    dead = [item for key, item in out if key == DEAD]
    assert [(d.offset, d.topic) for d in dead] == [(10, "gpu"), (11, "gpu"), (12, "gpu"), (13, "gpu")]
    assert all(b'"xid":79' in d.payload and "ahead of the newest event" in d.reason for d in dead)
    # A sweep that came as one record is refused as it came: one dead letter with its own bytes.
    sweep = b'{"ts": 1796139200, "node": "n", "gpus": [0, 1], "xid": [79, null]}'
    out = router.route("gpu/0", decode("gpu", sweep), order=(2, 0, 20), payload=sweep)  # type: ignore[arg-type]
    assert [(d.offset, d.payload) for key, d in out if key == DEAD] == [(20, sweep)]


def test_a_sweep_record_is_its_gpus_records_read_together():
    from trainguard.detectors.events import DeadLetter, decode
    from trainguard.detectors.lenient import FIELD_WARNINGS

    alone = [
        b'{"ts": 1796119200, "node": "n1", "gpu": 0, "util_pct": 97.5, "xid": null, "ecc_sbe_total": 3}',
        b'{"ts": 1796119200, "node": "n1", "gpu": 1, "util_pct": "NaN", "xid": 79, "ecc_sbe_total": 4}',
    ]
    sweep = (
        b'{"ts": 1796119200, "node": "n1", "gpus": [0, 1], "util_pct": [97.5, NaN], "xid": [null, 79], '
        b'"ecc_sbe_total": [3, 4]}'
    )
    FIELD_WARNINGS.clear()
    frame = decode("gpu", sweep)
    from_sweep = dict(FIELD_WARNINGS)
    FIELD_WARNINGS.clear()
    records = [decode("gpu", line) for line in alone]
    assert type(frame) is GpuFrame and list(frame.samples()) == records
    assert from_sweep == dict(FIELD_WARNINGS) == {("gpu", "util_pct"): 1}  # nulled and counted either way
    short = decode("gpu", b'{"ts": 1796119200, "node": "n1", "gpus": [0, 1], "temp_c": [40.0]}')
    assert type(short) is DeadLetter and "`temp_c` must be a list with one value per GPU (2)" in short.reason
    nameless = decode("gpu", b'{"ts": 1796119200, "gpus": [0]}')
    assert type(nameless) is DeadLetter and nameless.reason.startswith("GPU sweep: ") and "node" in nameless.reason


@pytest.mark.parametrize(
    ("util", "severity"),
    [(None, "critical"), (0.0, "critical"), (4.9, "critical"), (5.0, "warning"), (60.0, "warning")],
)
def test_a_gpu_slowed_by_heat_is_critical_only_while_idle(util: float | None, severity: str):
    # Idle, a hot GPU's cooling is failing (drain it); under load it slows the job (a warning).
    health = GpuHealth(idle_drift=False)
    found = []
    for t in range(3):  # throttle_samples in a row
        sweep = [
            GpuSample(ts=10.0 * t, node="n1", gpu=g, util_pct=util, throttle_reasons=0x40 if g else 0) for g in range(2)
        ]
        found += health.observe(GpuFrame.from_samples(sweep))
    assert [(f.category, f.gpus, f.severity) for f in found] == [("thermal_throttle", ["n1/1"], severity)]
    assert found[0].evidence == [f"n1/gpu1: thermal slowdown for 3 samples{' while idle' * (severity == 'critical')}"]
