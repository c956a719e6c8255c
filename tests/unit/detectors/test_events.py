"""Decoding of the wire contract: valid records, and every kind of garbage dead-lettered with a reason."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trainguard.detectors.events import (
    MAX_RECORD_BYTES,
    DeadLetter,
    GpuSample,
    JobEvent,
    LogRecord,
    NodeEvent,
    ProgressRecord,
    decode,
    parse_ts,
)


def test_decodes_each_topic_and_normalises_ts_and_ids():
    log = decode("logs", b'{"ts": "2026-12-02T10:00:00.123Z", "job_id": 7, "node": "n1", "line": "x"}')
    assert isinstance(log, LogRecord)
    assert log.ts == pytest.approx(1796205600.123) and log.job_id == "7" and log.source == "app"
    prog = decode("progress", b'{"ts": 1796205600, "job_id": "7", "node": "n1", "rank": 3, "step": 9, "extra": 1}')
    assert isinstance(prog, ProgressRecord) and prog.rank == 3 and prog.step_time_s is None
    gpu = decode("gpu", b'{"ts": 1796205600.5, "node": "n1", "gpu": 2, "util_pct": 99, "xid": 79}')
    assert isinstance(gpu, GpuSample) and gpu.xid == 79 and gpu.temp_c is None
    job = decode("scheduler", b'{"ts": 1796205600, "kind": "job", "job_id": 5, "state": "RUNNING", "nodes": ["a"]}')
    assert isinstance(job, JobEvent) and job.job_id == "5" and job.nodes == ["a"]
    node = decode("scheduler", b'{"ts": 1796205600, "kind": "node", "node": "a", "state": "DRAIN", "reason": "x"}')
    assert isinstance(node, NodeEvent) and node.reason == "x"


@pytest.mark.parametrize(
    ("topic", "payload", "reason_part"),
    [
        ("logs", b"{not json", "JSON"),
        ("logs", b'{"ts": 1796205600, "node": 5, "line": "x"}', "Expected `str`, got `int` - at `$.node`"),
        ("logs", b'{"ts": 1796205600, "node": "n1"}', "missing required field `line`"),
        ("progress", b'{"ts": 1796205600, "job_id": "1", "node": "n", "rank": "zero", "step": 1}', "$.rank"),
        ("gpu", b"\x00\xff\xfe binary \x89PNG\r\n", "JSON"),
        ("gpu", b"", "empty record"),
        ("gpu", b"[1, 2, 3]", "Expected `object`"),
        ("logs", b'{"ts": "yesterday", "node": "n", "line": "x"}', "not RFC 3339"),
        ("logs", b'{"ts": "2026-12-02T10:00:00", "node": "n", "line": "x"}', "no timezone"),
        ("logs", b'{"ts": 1796205600000, "node": "n", "line": "x"}', "milliseconds"),
        ("logs", b'{"ts": 12, "node": "n", "line": "x"}', "outside 2000..2100"),
        ("logs", b'{"ts": NaN, "node": "n", "line": "x"}', "not a finite number"),
        ("scheduler", b'{"ts": 1796205600, "kind": "rack", "node": "n", "state": "x"}', "Invalid value 'rack'"),
        ("metrics", b'{"ts": 1796205600}', "unknown topic"),
    ],
)
def test_garbage_is_dead_lettered_with_reason_and_original_bytes(topic, payload, reason_part):
    result = decode(topic, payload, partition=3, offset=41)
    assert isinstance(result, DeadLetter)
    assert reason_part in result.reason
    assert result.payload == payload and result.partition == 3 and result.offset == 41 and result.topic == topic


def test_oversized_record_is_refused_but_kept_whole():
    big = b'{"ts": 1796205600, "node": "n", "line": "' + b"x" * (1024 * 1024) + b'"}'
    result = decode("logs", big)
    assert isinstance(result, DeadLetter)
    assert f"{MAX_RECORD_BYTES}-byte limit" in result.reason
    assert result.payload == big


def test_parse_ts_accepts_offsets_and_numbers():
    assert parse_ts("2026-12-02T12:00:00+02:00") == parse_ts("2026-12-02T10:00:00Z")
    assert parse_ts(1796205600) == 1796205600.0
    with pytest.raises(ValueError, match="finite"):
        parse_ts(float("inf"))


_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=5),
    max_leaves=15,
)
_records = st.fixed_dictionaries(
    {},
    optional={
        "ts": st.one_of(st.floats(), st.integers(), st.text(max_size=30)),
        "node": _json_values,
        "job_id": _json_values,
        "line": _json_values,
        "rank": _json_values,
        "step": _json_values,
        "gpu": _json_values,
        "kind": st.sampled_from(["job", "node", "other"]),
        "state": _json_values,
        "nodes": _json_values,
    },
)


@settings(max_examples=400, deadline=None)
@given(topic=st.sampled_from(["logs", "progress", "gpu", "scheduler"]), raw=st.binary(max_size=300))
def test_decode_never_raises_on_arbitrary_bytes(topic, raw):
    result = decode(topic, raw)
    if isinstance(result, DeadLetter):
        assert result.reason and result.payload == raw


@settings(max_examples=400, deadline=None)
@given(topic=st.sampled_from(["logs", "progress", "gpu", "scheduler"]), record=_records)
def test_decode_never_raises_on_json_shaped_records(topic, record):
    raw = msgspec.json.encode(record)
    result = decode(topic, raw)
    assert isinstance(result, DeadLetter) or isinstance(result.ts, float)
