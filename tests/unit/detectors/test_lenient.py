"""One odd field never costs a whole record: optional fields are coerced or nulled, and counted."""

from __future__ import annotations

import json
import math

from hypothesis import given, settings
from hypothesis import strategies as st

from trainguard.detectors.events import DeadLetter, GpuSample, ProgressRecord, decode
from trainguard.detectors.lenient import FIELD_WARNINGS

GPU_OPTIONAL = (
    "util_pct",
    "mem_used_mib",
    "temp_c",
    "power_w",
    "sm_clock_mhz",
    "ecc_sbe_total",
    "ecc_dbe_total",
    "remapped_rows_pending",
    "pcie_replay_total",
    "nvlink_crc_total",
    "xid",
)
ODD = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**40), 2**40),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.sampled_from(["NaN", "inf", "-Infinity", "97.5", " 12 ", "true", "False", "N/A", "[Not Supported]"]),
)


def _raw(record: dict) -> bytes:
    return json.dumps(record, allow_nan=True).encode()


@settings(max_examples=300, derandomize=True, deadline=None)
@given(st.dictionaries(st.sampled_from(GPU_OPTIONAL), ODD, max_size=6))
def test_a_gpu_sample_with_usable_required_fields_is_never_dead_lettered(fields: dict) -> None:
    event = decode("gpu", _raw({"ts": 1_796_205_600.0, "node": "n1", "gpu": 3, **fields}))
    assert isinstance(event, GpuSample), getattr(event, "reason", "")
    for name in GPU_OPTIONAL:
        value = getattr(event, name)
        assert value is None or (
            isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
        )


@settings(max_examples=200, derandomize=True, deadline=None)
@given(st.sampled_from(["step_time_s", "compute_time_s", "tokens_per_s", "samples_per_s"]), ODD)
def test_a_progress_record_keeps_its_step_whatever_its_timings_say(name: str, value: object) -> None:
    event = decode(
        "progress", _raw({"ts": 1_796_205_600.0, "job_id": 4, "node": "n1", "rank": 0, "step": 7, name: value})
    )
    assert isinstance(event, ProgressRecord) and event.step == 7 and event.job_id == "4"


def test_the_meaning_is_kept_where_it_is_clear_and_each_field_is_counted() -> None:
    before = FIELD_WARNINGS.copy()
    event = decode(
        "gpu",
        b'{"ts": 1796205600, "node": "n1", "gpu": 0, "remapped_rows_pending": true, '
        b'"util_pct": "97.5", "power_w": NaN, "temp_c": "[Not Supported]", "ecc_dbe_total": 2.0}',
    )
    assert isinstance(event, GpuSample)
    assert (event.remapped_rows_pending, event.util_pct, event.power_w, event.temp_c, event.ecc_dbe_total) == (
        1,
        97.5,
        None,
        None,
        2,
    )
    grown = {k: FIELD_WARNINGS[k] - before.get(k, 0) for k in FIELD_WARNINGS}
    assert {f for (topic, f), n in grown.items() if n and topic == "gpu"} == {
        "remapped_rows_pending",
        "util_pct",
        "power_w",
        "temp_c",
        "ecc_dbe_total",
    }


def test_unusable_required_fields_still_dead_letter_with_the_reason() -> None:
    no_node = decode("gpu", b'{"ts": 1796205600, "gpu": 0, "util_pct": "50"}')
    assert isinstance(no_node, DeadLetter) and "node" in no_node.reason
    bad_step = decode("progress", b'{"ts": 1796205600, "job_id": 1, "node": "n", "rank": 0, "step": "soon"}')
    assert isinstance(bad_step, DeadLetter) and "step" in bad_step.reason
    not_json = decode("gpu", b'{"ts": 1796205600, "node": ')
    assert isinstance(not_json, DeadLetter)


def test_a_progress_records_beat_and_pid_are_read_leniently_and_counted():
    """The probe's newer fields: an exporter's "yes", a null or garbage never costs the step."""
    base = {"ts": 1_796_120_000.0, "job_id": "7", "node": "n1", "rank": 3, "step": 12}
    before = FIELD_WARNINGS[("progress", "beat")], FIELD_WARNINGS[("progress", "pid")]
    read = {
        json.dumps(odd): decode("progress", json.dumps({**base, **odd}).encode())
        for odd in ({"beat": "yes"}, {"beat": None}, {"beat": "maybe"}, {"beat": 0}, {"pid": "4242"}, {"pid": "x"})
    }
    assert all(isinstance(r, ProgressRecord) and r.step == 12 for r in read.values())
    assert [r.beat for r in read.values()][:4] == [True, False, False, False]
    assert read['{"pid": "4242"}'].pid == 4242 and read['{"pid": "x"}'].pid is None
    assert FIELD_WARNINGS[("progress", "beat")] == before[0] + 4
    assert FIELD_WARNINGS[("progress", "pid")] == before[1] + 2
    clean = decode("progress", json.dumps({**base, "beat": True, "pid": 99}).encode())
    assert isinstance(clean, ProgressRecord) and clean.beat and FIELD_WARNINGS[("progress", "beat")] == before[0] + 4
