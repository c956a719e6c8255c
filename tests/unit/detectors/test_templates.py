"""Online log-template mining (:mod:`detectors.templates`) and ``trainguard templates``."""

from __future__ import annotations

import json
import pickle
import string
from pathlib import Path

from typer.testing import CliRunner

from trainguard.benchmarks.microbench import FATAL, INFO, MEGATRON
from trainguard.cli.app import app
from trainguard.cli.templates import TEMPLATE_EVIDENCE, mine_unclassified
from trainguard.dataflows.archive import ParquetArchiveSink
from trainguard.dataflows.config import load_settings
from trainguard.detectors.events import Anomaly
from trainguard.detectors.ids import evidence_line
from trainguard.detectors.signatures import looks_fatal, match_line, use_site_signatures
from trainguard.detectors.templates import ErrorTemplates, TemplateHit, is_error_level

runner = CliRunner()

ERROR_LINES = [
    FATAL,
    "terminate called after throwing an instance of 'c10::Error'",
    "  what():  CUDA error: an illegal memory access was encountered",
    "Traceback (most recent call last):",
    "RuntimeError: NCCL communicator was aborted on rank 3",
    "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: train.py FAILED",
    "E1203 10:21:00.123456 12345 socket.cc:77] Connect to 10.1.2.3:29500 failed",
    "F1203 10:21:00.123456 12345 engine.cc:12] Check failed: ptr != nullptr",
    "gpu-node-0042:12:12 [3] NCCL WARN Cuda failure 'an illegal memory access'",
    "Assertion `idx < size` failed.",
    "/pytorch/aten/src/ATen/native/cuda/Indexing.cu:1289: block: [0,0,0] device-side assert triggered",
    "Fatal Python error: Segmentation fault",
    "Aborted (core dumped)",
    "KeyboardInterrupt",
    "CRITICAL: loader panic: shard index out of range",
    "worker 7 exited with code 1",
]
OTHER_LINES = [
    MEGATRON,
    INFO,
    "step 5 loss 1.2",
    "[2026-12-01 10:00:00,000] [INFO] [checkpointing.py:540] saved checkpoint to /ckpt/iter_0005000",
    "Epoch 3: 100%|██████████| 1250/1250 [04:12<00:00, 4.95it/s, loss=0.412]",
]


def _letters(i: int, width: int = 4) -> str:
    """A digit-free word per integer (digits would be masked, making every line one template)."""
    return "".join(string.ascii_lowercase[(i // 26**k) % 26] for k in range(width))


def _distinct(i: int) -> str:
    return f"{_letters(i)}Error {_letters(i + 7)} {_letters(i + 13)} {_letters(i + 29)} {_letters(i + 31)}"


def _tree_nodes(templates: ErrorTemplates) -> int:
    stack, count = [templates._miner.drain.root_node], 0
    while stack:
        node = stack.pop()
        count += 1
        stack.extend(node.key_to_child_node.values())
    return count


def test_only_error_level_lines_are_mined():
    t = ErrorTemplates()
    assert [t.observe(line) for line in OTHER_LINES] == [None] * len(OTHER_LINES)
    assert t.lines == 0 and len(t) == 0
    hits = [t.observe(line) for line in ERROR_LINES]
    assert all(isinstance(h, TemplateHit) for h in hits), [
        line for line, h in zip(ERROR_LINES, hits, strict=True) if h is None
    ]
    assert t.lines == len(ERROR_LINES)


def test_every_line_the_crash_detector_keeps_is_error_level():
    # CrashDetector keeps looks_fatal lines for crash/unclassified: the miner must see them all.
    fatal = [line for line in ERROR_LINES + OTHER_LINES if looks_fatal(line)]
    assert len(fatal) >= 8
    assert all(is_error_level(line) for line in fatal)


def test_templates_generalise_across_ranks_nodes_numbers_and_paths():
    t = ErrorTemplates()
    first = t.observe("[rank3]:[E1201 10:21:00.1 ProcessGroupNCCL.cpp:607] [Rank 3] Watchdog timeout after 600000 ms")
    second = t.observe("[rank61]:[E1201 10:24:13.9 ProcessGroupNCCL.cpp:607] [Rank 61] Watchdog timeout after 1800 ms")
    assert first is not None and second is not None
    assert second.template_id == first.template_id and not second.new
    # Masked, not merely wildcarded: the first line already gives the general template.
    assert first.template == second.template
    assert (
        first.template
        == "[rank<NUM>]:[E<NUM> <TIME> ProcessGroupNCCL.cpp:<NUM>] [Rank <NUM>] Watchdog timeout after <NUM> ms"
    )
    a = t.observe(
        "gpu-node-0042: ValueError: bad header in /data/shards/part-00012.bin at 0x7f3a2b0c from 10.1.2.3:29500"
    )
    b = t.observe("gpu-node-0117: ValueError: bad header in /mnt/ds/part-9.bin at 0xdeadbeef from 10.9.8.77:41000")
    assert a is not None and b is not None and a.template_id == b.template_id
    assert a.template == "gpu-node-<NUM>: ValueError: bad header in <PATH> at <HEX> from <IP>"
    assert len(t) == 2


def test_new_versus_seen_and_counts():
    t = ErrorTemplates()
    hits = [t.observe(f"RuntimeError: shard {i} of the checkpoint is truncated") for i in range(3)]
    assert [(h.new, h.count) for h in hits if h] == [(True, 1), (False, 2), (False, 3)]
    other = t.observe("terminate called after throwing an instance of 'foo::Bar'")
    assert other is not None and other.new and other.count == 1 and other.template_id != hits[0].template_id  # type: ignore[union-attr]
    assert other.evidence() == "template: terminate called after throwing an instance of 'foo::Bar' (new in this job)"
    assert other.evidence().startswith(TEMPLATE_EVIDENCE)  # so that `trainguard templates` skips it
    assert hits[-1].evidence().endswith("(3 lines)")  # type: ignore[union-attr]
    assert [(h.template, h.count) for h in t.templates()] == [
        ("RuntimeError: shard <NUM> of the checkpoint is truncated", 3),
        ("terminate called after throwing an instance of 'foo::Bar'", 1),
    ]
    t.reset()
    assert len(t) == 0 and t.lines == 0
    again = t.observe("RuntimeError: shard 9 of the checkpoint is truncated")
    assert again is not None and again.new


def test_pickle_round_trip_continues_exactly_where_it_left():
    before = [*ERROR_LINES, *(_distinct(i) for i in range(40)), *ERROR_LINES[:5]]
    after = [*ERROR_LINES, *(_distinct(i) for i in range(30, 60)), "RuntimeError: something new on rank 5"]
    t = ErrorTemplates(max_clusters=24)
    for line in before:
        t.observe(line)
    blob = pickle.dumps(t)
    restored = pickle.loads(blob)
    assert isinstance(restored, ErrorTemplates)
    assert restored.templates() == t.templates() and restored.lines == t.lines and len(restored) == len(t)
    assert [restored.observe(line) for line in after] == [t.observe(line) for line in after]
    # A template new after the snapshot gets a fresh id, never one of the kept ones.
    last = restored.observe("OSError: a different failure entirely")
    assert last is not None and last.new and last.template_id > max(h.template_id for h in t.templates())
    # The snapshot holds the templates, not drain3's objects: small, and independent of drain3's internals.
    assert len(blob) < 8_000
    assert b"drain3" not in blob and b"cachetools" not in blob


def test_memory_is_bounded():
    t = ErrorTemplates(max_clusters=16, max_chars=200)
    for i in range(3000):
        hit = t.observe(_distinct(i))
        assert hit is not None and hit.new  # each line is its own template
    drain = t._miner.drain
    assert len(t) == 16 and len(drain.id_to_cluster) == 16
    assert set(t._recent) == set(drain.id_to_cluster.keys())  # our recency order mirrors drain3's LRU
    assert _tree_nodes(t) < 200  # the prefix tree is rebuilt from the kept templates, not left to grow
    assert t.observe(_distinct(2999)).new is False  # type: ignore[union-attr]  # the latest are kept
    assert t.observe(_distinct(0)).new is True  # type: ignore[union-attr]  # the oldest were forgotten
    long = t.observe("RuntimeError: " + "x " * 5000)
    assert long is not None and len(long.template) <= 200
    assert len(pickle.dumps(t)) < 8_000


def _write_archive(root: Path, anomalies: list[Anomaly]) -> None:
    sink = ParquetArchiveSink(root, "anomalies")
    part = sink.build_part("anomalies", "anomalies", None)
    part.write_batch(anomalies)
    part.close()


def _unclassified(job: str, node: str, at: float, lines: list[tuple[int, str]]) -> Anomaly:
    return Anomaly(
        anomaly_id=f"an-{job}-{at:.0f}",
        detected_at=at,
        onset_ts=at - 5,
        kind="crash",
        category="unclassified",
        job_id=job,
        nodes=[node],
        ranks=sorted({rank for rank, _ in lines}),
        confidence=0.4,
        evidence=[evidence_line(node, rank, line) for rank, line in lines]
        + ["no catalogue signature explains these lines; the job stopped after them"]
        # What the job monitor adds: not a log line, never mined.
        + [TemplateHit(1, lines[0][1], 1, True).evidence()],
    )


def test_templates_command_ranks_unclassified_lines_from_an_archive(tmp_path: Path):
    terminate = "terminate called after throwing an instance of 'foo::Bar'"
    anomalies = [
        _unclassified("7", "node-7", 1796205600.0, [(3, terminate), (5, terminate), (1, "FATAL: shard 3 bad header")]),
        _unclassified("8", "node-8", 1796205700.0, [(0, terminate), (2, "FATAL: shard 12 bad header")]),
        _unclassified("9", "node-9", 1796205800.0, [(4, "FATAL: shard 5 bad header")]),
        Anomaly(
            anomaly_id="an-x",
            detected_at=1796205900.0,
            kind="crash",
            category="xid_79",
            job_id="9",
            evidence=[evidence_line("node-9", None, "NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus")],
        ),
    ]
    _write_archive(tmp_path, anomalies)

    result = runner.invoke(app, ["templates", str(tmp_path), "--json"])
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in result.output.splitlines()]
    assert [(r["template"], r["anomalies"], r["lines"], r["jobs"]) for r in rows] == [
        ("FATAL: shard <NUM> bad header", 3, 3, ["7", "8", "9"]),
        (terminate, 2, 3, ["7", "8"]),
    ]
    assert rows[0]["example"] == "FATAL: shard 3 bad header"  # the line as logged, prefix stripped

    top = runner.invoke(app, ["templates", str(tmp_path), "--json", "--top", "1"])
    assert len(top.output.splitlines()) == 1

    table = runner.invoke(app, ["templates", str(tmp_path)])
    assert table.exit_code == 0, table.output
    assert "2 from 6 lines of 3 anomalies" in table.output
    assert "FATAL: shard <NUM> bad header" in table.output and "7, 8, 9" in table.output
    assert "Xid" not in table.output  # classified anomalies are not the catalogue's to-do list


def test_templates_command_on_a_replay_archive(tmp_path: Path):
    def ts(s: int) -> str:
        return f"2026-12-01T10:{s // 60:02d}:{s % 60:02d}.000Z"

    records = []
    for job, node, off in (("7", "node-7", 0), ("8", "node-8", 5)):
        for s in range(0, 60, 10):
            line = f"iteration {s // 10 + 1}/100 | lm loss: 2.1 | elapsed time per iteration (ms): 812.5"
            records.append({"ts": ts(s + off), "job_id": job, "node": node, "rank": 0, "line": line})
        for rank in (3, 5):
            line = "terminate called after throwing an instance of 'foo::Bar'"
            records.append({"ts": ts(61 + off + rank), "job_id": job, "node": node, "rank": rank, "line": line})
    records.sort(key=lambda r: r["ts"])
    replay = tmp_path / "replay"
    replay.mkdir()
    (replay / "logs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    out = tmp_path / "out"
    ran = runner.invoke(app, ["replay", str(replay), "--quiet", "--out", str(out)])
    assert ran.exit_code == 0, ran.output

    result = runner.invoke(app, ["templates", str(out), "--json"])
    assert result.exit_code == 0, result.output
    (row,) = [json.loads(line) for line in result.output.splitlines()]
    assert row["template"] == "terminate called after throwing an instance of 'foo::Bar'"
    assert (row["anomalies"], row["lines"], row["jobs"]) == (2, 4, ["7", "8"])


def test_templates_command_missing_or_empty_archive_is_one_sentence(tmp_path: Path):
    missing = runner.invoke(app, ["templates", str(tmp_path / "nope")])
    assert missing.exit_code == 1
    assert missing.output.strip().startswith("error:") and len(missing.output.strip().splitlines()) == 1
    assert "Traceback" not in missing.output
    (tmp_path / "anomalies").mkdir()
    empty = runner.invoke(app, ["templates", str(tmp_path), "--json"])
    assert empty.exit_code == 1 and "holds no anomalies" in empty.output
    assert len(empty.output.strip().splitlines()) == 1
    both = runner.invoke(app, ["templates", str(tmp_path), "--json", "--signatures"])
    assert both.exit_code == 1 and "give one of them" in both.output
    assert len(both.output.strip().splitlines()) == 1


def test_an_archive_without_unclassified_anomalies_has_nothing_to_mine(tmp_path: Path):
    _write_archive(tmp_path, [Anomaly(anomaly_id="an-1", detected_at=1796205600.0, kind="hang", category="hang")])
    result = runner.invoke(app, ["templates", str(tmp_path)])
    assert result.exit_code == 0 and "none is unclassified" in result.output
    from trainguard.dataflows.archive import read_dataset

    assert mine_unclassified(read_dataset(tmp_path, "anomalies")) == []


def test_templates_become_site_signatures_that_load_and_read_the_lines_they_came_from(tmp_path: Path):
    lines = [
        # Aligned columns and dates with a space: the miner collapses the one and masks the other.
        (3, "ERROR    shard 3 bad header at 2024-05-01 12:00:00 in /data/shards/part-0003.bin"),
        (1, "ERROR    shard 12 bad header at 2024-05-02 13:10:07 in /data/shards/part-0012.bin"),
        (2, "terminate called after throwing an instance of 'foo::Bar'"),
    ]
    _write_archive(tmp_path, [_unclassified("7", "node-7", 1796205600.0, lines)])
    result = runner.invoke(app, ["templates", str(tmp_path), "--signatures"])
    assert result.exit_code == 0, result.output
    config = tmp_path / "site.yaml"
    config.write_text(result.output)
    site = load_settings(config).detectors.signatures
    assert len(site) == 2
    try:
        use_site_signatures(site)
        for _, line in lines:
            match = match_line(line)
            assert match is not None and match.signature.id.startswith("site:template-"), line
        assert match_line("ERROR shard 3 bad footer at 2024-05-01 12:00:00 in /data/x") is None
    finally:
        use_site_signatures([])
