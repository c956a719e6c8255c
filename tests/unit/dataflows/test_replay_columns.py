"""GPU telemetry read as columns gives the flow exactly what reading it record by record gives."""

from __future__ import annotations

import contextlib
import json
import math
import os
import random
import signal
import threading
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from hypothesis import given, settings
from hypothesis import strategies as st

from trainguard.dataflows import replay
from trainguard.dataflows.records import replay_routed
from trainguard.dataflows.replay_columns import (
    _BLOCK_BYTES,
    GpuBlock,
    jsonl_blocks,
    line_blocks,
    parquet_blocks,
    read_ahead,
    sweep_starts,
)
from trainguard.detectors.events import DeadLetter, decode
from trainguard.detectors.frames import FIELDS, GpuFrame, rare_rows, throttle_mask

T0 = 1_796_119_200.0


def _records(rounds: int, seed: int = 3) -> list[dict]:
    rng = random.Random(seed)
    out = []
    for r in range(rounds):
        for node in ("n1", "n2", "n3"):
            for g in range(8):
                out.append(
                    {
                        "ts": T0 + 10 * r + (0.25 if node == "n2" else 0.0),
                        "node": node,
                        "gpu": g,
                        "util_pct": rng.uniform(0, 100),
                        "power_w": rng.uniform(60, 600),
                        "ecc_sbe_total": r // 7,
                        "throttle_reasons": rng.choice((0, 0x20)),
                        "xid": 79 if (r, node, g) == (5, "n3", 2) else None,
                        "pci_bus_id": f"00000000:{g:02X}:00.0",
                    }
                )
    return out


def _as_records(directory: Path) -> list[tuple]:
    """What the replay hands the router, GPU frames opened back into their records."""
    out = []
    for _, item in replay.merged_events(directory):
        if type(item) is DeadLetter:
            out.append(("dead", item.offset, item.reason))
            continue
        event = item.event
        samples = list(event.samples()) if type(event) is GpuFrame else [event]
        for i, sample in enumerate(samples):
            out.append((item.order[2] + i, *(getattr(sample, f) for f in sample.__struct_fields__)))
    return out


def _decoded_one_by_one(lines: list[bytes]) -> list[tuple]:
    out = []
    for offset, line in enumerate(lines):
        event = decode("gpu", line, 0, offset)
        if type(event) is DeadLetter:
            out.append(("dead", offset, event.reason))
        else:
            # A frame keeps throttle reasons as the NVML bitmask (what every rule reads).
            fields = [getattr(event, f) for f in event.__struct_fields__]
            out.append((offset, *(throttle_mask(v) if isinstance(v, list) else v for v in fields)))
    return out


def test_clean_json_lines_become_frames_of_a_node_and_instant(tmp_path: Path):
    lines = [json.dumps(r).encode() for r in _records(40)]
    (tmp_path / "gpu.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    items = [item.event for _, item in replay.merged_events(tmp_path)]
    assert all(type(e) is GpuFrame and len(e) == 8 for e in items) and len(items) == 40 * 3
    assert [block is not None for block, _ in jsonl_blocks(tmp_path / "gpu.jsonl")] == [True]
    assert _as_records(tmp_path) == _decoded_one_by_one(lines)
    # Which GPUs of a frame are news on their own, as the block worked it out: what the frame's values say.
    assert any(e.rare for e in items)
    assert all(e.rare_gpus() == rare_rows(e.values).tolist() and e.rare == any(e.rare_gpus()) for e in items)


def test_odd_records_are_read_as_the_decoder_reads_them(tmp_path: Path, monkeypatch):
    monkeypatch.setattr("trainguard.dataflows.replay_columns._BLOCK_BYTES", 4096)  # several blocks, some odd
    records = _records(60)
    lines = [json.dumps(r).encode() for r in records]
    lines[50] = lines[50].replace(b'"util_pct": ', b'"util_pct": "97.5", "x": ')  # a numeric string: coerced
    lines[151] = json.dumps({**records[151], "throttle_reasons": ["hw_slowdown"]}).encode()  # names: the decoder
    lines[300] = json.dumps({k: v for k, v in records[300].items() if k != "node"}).encode()  # dead letter
    lines[301] = lines[301].replace(b'"power_w": ', b'"power_w": NaN, "y": ')  # nulled
    lines[700] = json.dumps({**records[700], "ts": T0 + 10 * 500_000}).encode()  # far off: where it stands
    lines[900] = json.dumps({**records[900], "node": 7}).encode()  # not a name: refused
    lines[1000] = json.dumps({**records[1000], "gpu": 2.0}).encode()  # a float index: the decoder's call
    (tmp_path / "gpu.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    kinds = {type(block).__name__ for block, _ in jsonl_blocks(tmp_path / "gpu.jsonl")}
    assert kinds == {"GpuBlock", "list", "NoneType"}  # columns, a block decoded at once, line by line
    read = _as_records(tmp_path)
    one_by_one = _decoded_one_by_one(lines)
    # The far-off record keeps its place in the file (the router refuses it later); the rest in file order.
    assert sorted(read, key=lambda r: r[1] if r[0] == "dead" else r[0]) == one_by_one
    assert sum(r[0] == "dead" for r in read) == 2


def test_records_glued_on_one_line_beside_a_line_of_spaces_are_read_line_by_line(tmp_path: Path):
    # Neither polars nor the decoder may take the block whole: the line of spaces would be skipped, and the
    # glued line would make up for it in the count.
    lines = [json.dumps(r).encode() for r in _records(4)]
    body = [*lines[:10], lines[10] + lines[11], b"   ", *lines[12:]]
    (tmp_path / "gpu.jsonl").write_bytes(b"\n".join(body) + b"\n")
    assert [block for block, _ in jsonl_blocks(tmp_path / "gpu.jsonl")] == [None]
    read = _as_records(tmp_path)
    dead = [r for r in read if r[0] == "dead"]
    assert len(dead) == 1 and "trailing characters" in dead[0][2]  # the glued line, refused whole
    assert len(read) == len(lines) - 1  # every other record read


def test_after_a_fork_blocks_are_decoded_at_once_into_the_same_frames(tmp_path: Path, monkeypatch):
    # polars may not run in a forked worker: the decoder reads each block in one call instead.
    lines = [json.dumps(r).encode() for r in _records(40)]
    (tmp_path / "gpu.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    columns = [(item.event.gpus, item.order) for _, item in replay.merged_events(tmp_path)]
    monkeypatch.setattr("trainguard.dataflows.replay_columns._FORKED", True)
    assert {type(block).__name__ for block, _ in jsonl_blocks(tmp_path / "gpu.jsonl")} == {"list"}
    assert [(item.event.gpus, item.order) for _, item in replay.merged_events(tmp_path)] == columns
    assert _as_records(tmp_path) == _decoded_one_by_one(lines)


def test_node_names_polars_may_have_read_from_other_values_are_checked_against_the_bytes(tmp_path: Path, monkeypatch):
    # polars reads 123, true, [..] or {..} where a name belongs as the text "123", "true", ...; the decoder
    # refuses them. A block holding such a name is asked of its bytes whether each node was a JSON string.
    monkeypatch.setattr("trainguard.dataflows.replay_columns._BLOCK_BYTES", 4096)
    records = _records(40)
    bad = {100: 123, 300: True, 500: ["x"], 700: {"a": 1}, 900: 1.5, 910: False}  # each in a block of its own
    compact = {"separators": (",", ":")}
    lines = [json.dumps(r, **compact if i % 2 else {}).encode() for i, r in enumerate(records)]
    for i, value in bad.items():
        lines[i] = json.dumps({**records[i], "node": value}).encode()
    named = [json.dumps({**r, "node": {"n1": "123", "n2": "true", "n3": "[x]"}[r["node"]]}).encode() for r in records]
    for name, file_lines in (("bad", lines), ("named", named)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "gpu.jsonl").write_bytes(b"\n".join(file_lines) + b"\n")
        read = _as_records(tmp_path / name)
        assert sorted(read, key=lambda r: r[1] if r[0] == "dead" else r[0]) == _decoded_one_by_one(file_lines)
    assert sum(r[0] == "dead" for r in _as_records(tmp_path / "bad")) == len(bad)
    # Texts that merely look like another value are names: those blocks are still read as columns.
    assert {type(block).__name__ for block, _ in jsonl_blocks(tmp_path / "named" / "gpu.jsonl")} == {"GpuBlock"}


@settings(max_examples=200, deadline=None)
@given(
    lines=st.lists(st.binary(min_size=0, max_size=40).map(lambda b: b.replace(b"\n", b"x")), max_size=30),
    end=st.booleans(),
    size=st.integers(1, 64),
    first=st.one_of(st.none(), st.integers(1, 64)),
)
def test_line_blocks_cut_a_file_after_newlines_and_lose_nothing(tmp_path_factory, lines, end, size, first):
    content = b"\n".join(lines) + (b"\n" if end and lines else b"")
    path = tmp_path_factory.mktemp("blocks") / "f"
    path.write_bytes(content)
    blocks = list(line_blocks(path, size, first))
    assert all(block.endswith(b"\n") for block in blocks)
    assert b"".join(blocks) == (content if not content or content.endswith(b"\n") else content + b"\n")
    for block in blocks:  # as large as asked at most, unless it starts with a line longer than that
        assert len(block) <= max(size, first or 0) or len(block.split(b"\n", 1)[0]) >= min(size, first or size)


def test_parquet_batches_read_as_columns_match_json_lines(tmp_path: Path):
    records = _records(30)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "a" / "gpu.jsonl").write_bytes(b"\n".join(json.dumps(r).encode() for r in records) + b"\n")
    table = pa.Table.from_pylist(records)
    pq.write_table(table, tmp_path / "b" / "gpu.parquet")
    assert _as_records(tmp_path / "a") == _as_records(tmp_path / "b")
    frames = [item.event for _, item in replay.merged_events(tmp_path / "b")]
    assert all(type(e) is GpuFrame for e in frames)


def test_blocks_the_columns_cannot_vouch_for_are_read_as_records(tmp_path: Path, monkeypatch):
    monkeypatch.setattr("trainguard.dataflows.replay_columns._BLOCK_BYTES", 2048)  # each oddity in its own block
    records = _records(40)
    lines = [json.dumps(r).encode() for r in records]
    lines[60] = lines[60].replace(b'"power_w": ', b'"power_w": 1e999, "z": ')  # overflows: polars refuses it
    lines[200] = json.dumps({**records[200], "gpu": None}).encode()  # no GPU: a dead letter
    lines[400] = json.dumps({**records[400], "ts": 1e13}).encode()  # far beyond any plausible time
    lines[600] = json.dumps({**records[600], "node": None}).encode()
    (tmp_path / "gpu.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    kinds = [type(block).__name__ for block, _ in jsonl_blocks(tmp_path / "gpu.jsonl")]
    assert "GpuBlock" in kinds and len(kinds) - kinds.count("GpuBlock") >= 4
    read = _as_records(tmp_path)
    assert sorted(read, key=lambda r: r[1] if r[0] == "dead" else r[0]) == _decoded_one_by_one(lines)


def test_parquet_columns_of_other_types_or_missing_read_as_json_lines_do(tmp_path: Path):
    # A field no row has, and one every row has as null (Arrow types that column as null).
    records = [{**{k: v for k, v in r.items() if k != "power_w"}, "xid": None} for r in _records(30)]
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "a" / "gpu.jsonl").write_bytes(b"\n".join(json.dumps(r).encode() for r in records) + b"\n")
    table = pa.Table.from_pylist(records)
    node = table.schema.get_field_index("node")
    table = table.set_column(node, "node", table["node"].cast(pa.large_string()))
    pq.write_table(table, tmp_path / "b" / "gpu.parquet")
    assert pq.read_schema(tmp_path / "b" / "gpu.parquet").field("xid").type == pa.null()
    assert _as_records(tmp_path / "a") == _as_records(tmp_path / "b")
    assert all(type(item.event) is GpuFrame for _, item in replay.merged_events(tmp_path / "b"))


def test_a_forked_worker_reads_parquet_as_columns_without_polars(tmp_path: Path):
    # A worker of `replay --processes` is forked from a process that has used polars, whose thread pool does
    # not come along: a polars call there would never return. Arrow's own columns must give the same frames.
    pq.write_table(pa.Table.from_pylist(_records(30)), tmp_path / "gpu.parquet")
    expected = _as_records(tmp_path)  # (polars at work here)
    answer, tell = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            signal.alarm(30)  # a hang ends the child, and the test fails
            kinds = {type(block).__name__ for block, _ in parquet_blocks(tmp_path / "gpu.parquet")}
            os.write(tell, b"1" if kinds == {"GpuBlock"} and _as_records(tmp_path) == expected else b"0")
        finally:
            os._exit(0)
    os.close(tell)
    os.waitpid(pid, 0)
    assert os.read(answer, 1) == b"1"


def test_a_parquet_batch_holding_an_infinity_or_a_value_too_large_is_read_record_by_record(tmp_path: Path, monkeypatch):
    records = _records(10)
    records[17]["power_w"] = float("inf")
    (tmp_path / "a").mkdir()
    pq.write_table(pa.Table.from_pylist(records), tmp_path / "a" / "gpu.parquet")
    (tmp_path / "b").mkdir()
    table = pa.Table.from_pylist(_records(10))
    big = pa.array([2**64 - 1] + [0] * (len(table) - 1), type=pa.uint64())  # no int64 holds it
    pq.write_table(
        table.set_column(table.schema.get_field_index("ecc_sbe_total"), "ecc_sbe_total", big),
        tmp_path / "b" / "gpu.parquet",
    )
    read = {d: _as_records(tmp_path / d) for d in "ab"}
    monkeypatch.setattr("trainguard.dataflows.replay_columns._FORKED", True)  # (a forked worker: Arrow's columns)
    assert {d: _as_records(tmp_path / d) for d in "ab"} == read
    monkeypatch.setattr("trainguard.dataflows.replay_columns._checked", lambda table: None)
    assert read == {d: _as_records(tmp_path / d) for d in "ab"}  # what the record path gives, row by row
    assert read["a"][17][0] == 17 and not any(isinstance(v, float) and math.isinf(v) for v in read["a"][17])


def test_block_size_is_sane():
    assert _BLOCK_BYTES >= 1 << 20


def _progress_lines(rng: random.Random, n: int) -> list[bytes]:
    lines = []
    for i in range(n):
        record = {"ts": T0 + i * 0.1, "job_id": rng.choice(("7", 7, "8")), "node": "n1", "rank": i % 4, "step": i // 4}
        if rng.random() < 0.01:
            record["step_time_s"] = rng.choice((1.5, "1.5", True, "NaN", None))  # some need the lenient rules
        lines.append(json.dumps(record).encode())
    return lines


def test_other_topics_decoded_a_block_at_a_time_give_what_each_line_gives(tmp_path: Path, monkeypatch):
    monkeypatch.setattr("trainguard.dataflows.replay.decode_block", _counting(replay.decode_block))
    monkeypatch.setattr("trainguard.dataflows.replay._RECORD_BLOCK_BYTES", 4096)  # many blocks, some odd
    rng = random.Random(5)
    lines = _progress_lines(rng, 3000)
    lines[1700] = b'{"ts": "yesterday", "job_id": "7", "node": "n1", "rank": 0, "step": 1}'  # refused
    lines[2500] = b"   "  # blank: not a record
    (tmp_path / "progress.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    got = [
        ("dead", item.offset, item.reason) if type(item) is DeadLetter else (item.order[2], item.event, item.payload)
        for _, item in replay.merged_events(tmp_path)
    ]
    expected = []
    for offset, line in enumerate(line for line in lines if line.strip()):
        event = decode("progress", line, 0, offset)
        expected.append(("dead", offset, event.reason) if type(event) is DeadLetter else (offset, event, line))
    assert got == expected
    assert 0 < _counting.placed < _counting.blocks  # some blocks decoded at once, some line by line


def _counting(decode_block):
    def wrapped(topic: str, block: bytes):
        events = decode_block(topic, block)
        _counting.placed += events is not None
        _counting.blocks += 1
        return events

    _counting.placed = _counting.blocks = 0
    return wrapped


def test_decode_block_refuses_what_must_be_read_line_by_line():
    from trainguard.detectors.events import decode_block

    good = b'{"ts": 1796119200.5, "job_id": 7, "node": "n1", "rank": 0, "step": 3}\n'
    events = decode_block("progress", good * 3)
    assert events is not None and [e.job_id for e in events] == ["7"] * 3  # settled as decode() settles them
    assert decode_block("progress", good + b"\n" + good) is None  # a blank line
    assert decode_block("progress", b"\n" + good) is None  # ... first
    assert decode_block("progress", good + b"   \n") is None  # ... of spaces
    # A block over the record limit counts its lines another way: the same refusals, and a line over the limit.
    from trainguard.detectors.events import MAX_RECORD_BYTES

    many = good * (MAX_RECORD_BYTES // len(good) + 10)
    assert len(decode_block("progress", many)) == many.count(b"\n")
    assert decode_block("progress", many + b"\n" + good) is None
    assert decode_block("progress", b"\n" + many) is None
    huge = good.replace(b'"n1"', b'"' + b"n" * MAX_RECORD_BYTES + b'"')
    assert decode_block("progress", good * 3 + huge) is None
    # Two records glued on one line (a dead letter on its own) beside a blank line: the counts agree, yet
    # the block must still be read line by line.
    glued = good.rstrip(b"\n") + good
    for block in (glued + b"\n", b"\n" + glued, good + glued + b"\n" + good, many + glued + b"\n", glued + b"   \n"):
        assert decode_block("progress", block) is None
    assert decode_block("progress", good + b"  " + good) is None  # not a lone object at its start: read alone
    assert decode_block("progress", good.rstrip(b"\n")) is None  # not whole lines
    assert decode_block("progress", good.replace(b"\n", b"\r\n")) is None
    assert decode_block("progress", good.replace(b"1796119200.5", b"1796119200500")) is None  # ms: refused
    assert decode_block("progress", good.replace(b"3}", b'"3"}')) is None  # the lenient rules' business
    assert decode_block("logs", b'{"ts": "2026-12-01T10:00:00Z", "node": "n1", "line": "x"}\n') is not None
    # Text timestamps and number job ids are settled record by record, as decode() settles them.
    mixed = good + good.replace(b"1796119200.5", b'"2026-12-01T10:00:00Z"').replace(b"7", b'"7"')
    assert [(e.ts, e.job_id) for e in decode_block("progress", mixed)] == [
        (decode("progress", line).ts, "7") for line in mixed.splitlines()
    ]


def test_a_file_that_starts_with_unreadable_timestamps_is_keyed_as_record_by_record(tmp_path: Path, monkeypatch):
    # The record path settles where a file starts after 16 timestamps or a full chunk of waiting records,
    # whichever comes first: a block decoded at once must not settle later, on other samples.
    unreadable = b'{"ts": "2026-12-02 10:00:00", "job_id": "7", "node": "n1", "rank": 0, "step": 1}'  # no zone
    clean = [
        json.dumps({"ts": T0 + (36_000 if i < 6 else 0) + i, "job_id": "7", "node": "n1", "rank": 0, "step": i})
        for i in range(40)
    ]
    (tmp_path / "progress.jsonl").write_bytes(b"\n".join([unreadable] * 4085 + [c.encode() for c in clean]) + b"\n")
    (tmp_path / "logs.jsonl").write_bytes(
        b"\n".join(json.dumps({"ts": T0 + 100 + i, "node": "n1", "line": "x"}).encode() for i in range(40)) + b"\n"
    )
    # The first block: exactly the unreadable lines (read one by one); the next decodes at once.
    monkeypatch.setattr("trainguard.dataflows.replay._RECORD_BLOCK_BYTES", 4085 * (len(unreadable) + 1))

    def keys() -> list[tuple]:
        return [
            (key, getattr(item, "order", None) or ("dead", item.offset)) for key, item in replay.merged_events(tmp_path)
        ]

    at_once = keys()
    monkeypatch.setattr("trainguard.dataflows.replay.decode_block", lambda topic, block: None)
    assert at_once == keys()


def test_a_gpu_reported_twice_in_one_instant_starts_a_new_frame_as_records_do(tmp_path: Path, monkeypatch):
    records = _records(4)
    records.insert(3, {**records[1], "util_pct": 1.0})  # n1's GPU 1 again, same instant
    lines = [json.dumps(r).encode() for r in records]
    (tmp_path / "gpu.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    columns = [(item.event.node, item.event.gpus, item.order[2]) for _, item in replay.merged_events(tmp_path)]
    assert columns[:2] == [("n1", (0, 1, 2), 0), ("n1", (1, 3, 4, 5, 6, 7), 3)]
    monkeypatch.setattr("trainguard.dataflows.replay_columns._FORKED", True)  # the records' path, then frames
    assert [(item.event.node, item.event.gpus, item.order[2]) for _, item in replay.merged_events(tmp_path)] == columns
    assert _as_records(tmp_path) == _decoded_one_by_one(lines)


def test_reading_ahead_keeps_the_order_raises_where_asked_and_stops_when_closed():
    made: list[int] = []

    def numbers(fail_at: int | None = None):
        for i in range(1000):
            if i == fail_at:
                raise ValueError(f"bad block {i}")
            made.append(i)
            yield i

    assert list(read_ahead(numbers(), depth=2)) == list(range(1000))

    got = []
    try:
        for item in read_ahead(numbers(fail_at=7)):
            got.append(item)
    except ValueError as error:
        assert str(error) == "bad block 7"
    assert got == list(range(7))  # everything before the failure, then the failure itself

    made.clear()
    closed = []

    def tracked():
        try:
            yield from numbers()
        finally:
            closed.append(True)  # (a file read this way closes here)

    ahead = read_ahead(tracked(), depth=1)
    assert [next(ahead) for _ in range(3)] == [0, 1, 2]
    ahead.close()
    assert closed == [True]
    assert not any(t.name == "trainguard-read-ahead" and t.is_alive() for t in threading.enumerate())
    assert len(made) <= 6  # stopped a couple of items ahead, not read to the end


def test_batches_cut_from_windows_are_the_records_in_order_and_skip_resumes_where_it_left(tmp_path: Path):
    rng = random.Random(9)
    (tmp_path / "progress.jsonl").write_bytes(b"\n".join(_progress_lines(rng, 5000)) + b"\n")
    records = [item for _, item in replay.merged_events(tmp_path)]
    batches = replay._Windows(replay.merged_event_windows(tmp_path), 333, None)
    got = []
    with contextlib.suppress(StopIteration):
        while True:
            batch = batches.next_batch()
            assert 0 < len(batch) <= 333
            got += replay_routed(batch)
    assert got == records
    resumed = replay._Windows(replay.merged_event_windows(tmp_path), 333, None)
    assert resumed.skip(1234) == 1234
    assert replay_routed(resumed.next_batch()) == records[1234 : 1234 + 333]


@settings(max_examples=200, deadline=None, derandomize=True)
@given(
    st.lists(
        st.tuples(st.integers(0, 2), st.integers(0, 1), st.lists(st.integers(0, 7), min_size=1, max_size=8)),
        min_size=1,
        max_size=12,
    )
)
def test_a_block_is_cut_into_frames_by_the_record_rule(sweeps):
    """Rows of one node and instant are a frame until a GPU comes twice, whatever order the GPUs come in."""
    rows = [(T0 + t, node, gpu) for t, node, gpus in sweeps for gpu in gpus]
    ts, nodes, gpus = (list(column) for column in zip(*rows, strict=True))
    block = GpuBlock(np.array(ts), ["n0", "n1"], np.array(nodes), gpus, np.zeros((len(FIELDS), len(rows))), None, None)
    assert block._starts() == sweep_starts(ts, nodes, gpus)
