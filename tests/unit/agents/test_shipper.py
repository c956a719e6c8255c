"""The log shipper: whole lines only, resumable offsets, truncation and rotation."""

from __future__ import annotations

import os
from pathlib import Path

from trainguard.agents.shipper import LogTailer
from trainguard.detectors.events import LogRecord, decode


def lines_of(records: list[dict]) -> list[str]:
    return [r["line"] for r in records]


def test_whole_lines_with_job_rank_and_stamps(tmp_path: Path):
    log = tmp_path / "slurm-4242.out"
    log.write_text(
        "0: 2026-12-01T10:00:00Z iteration 1/ 10 | elapsed time per iteration (ms): 900.0 |\n3: [rank3]: boo"
    )
    tailer = LogTailer([log], node="gpu-node-02")
    first = tailer.read(now=lambda: 1_796_210_000.0)
    assert lines_of(first) == ["2026-12-01T10:00:00Z iteration 1/ 10 | elapsed time per iteration (ms): 900.0 |"]
    assert first[0]["job_id"] == "4242" and first[0]["rank"] == 0 and first[0]["ts"] == 1_796_119_200.0
    with log.open("a") as fh:
        fh.write("m\nNVRM: Xid (PCI:0000:3b:00): 79, pid=1\n")
    second = tailer.read(now=lambda: 1_796_210_001.0)
    assert lines_of(second) == ["[rank3]: boom", "NVRM: Xid (PCI:0000:3b:00): 79, pid=1"]
    assert second[0]["rank"] == 3 and second[0]["ts"] == 1_796_210_001.0 and second[1]["source"] == "kernel"
    import msgspec

    assert all(isinstance(decode("logs", msgspec.json.encode(r)), LogRecord) for r in first + second)


def test_restart_resumes_after_the_last_committed_line(tmp_path: Path):
    log, state = tmp_path / "train.log", tmp_path / "state.json"
    log.write_text("a\nb\nhalf")
    tailer = LogTailer([log], state)
    assert lines_of(tailer.read()) == ["a", "b"]
    tailer.commit()
    assert lines_of(LogTailer([log], state).read()) == []  # nothing new: no flood after a restart
    uncommitted = LogTailer([log], state)
    with log.open("a") as fh:
        fh.write(" line\nc\n")
    assert lines_of(uncommitted.read()) == ["half line", "c"]  # not committed (delivery failed) …
    assert lines_of(LogTailer([log], state).read()) == ["half line", "c"]  # … so shipped again: at least once


def test_truncation_and_rotation(tmp_path: Path):
    log, state = tmp_path / "train.log", tmp_path / "state.json"
    log.write_text("one\ntwo\n")
    tailer = LogTailer([log], state)
    assert lines_of(tailer.read()) == ["one", "two"]
    log.write_text("x\n")  # truncated and rewritten (open-mode=truncate)
    assert lines_of(tailer.read()) == ["x"]
    with log.open("a") as fh:
        fh.write("last of the old file\n")
    os.rename(log, tmp_path / "train.log.1")  # rotated: the old file keeps its inode
    log.write_text("first of the new file\n")
    assert lines_of(tailer.read()) == ["last of the old file", "first of the new file"]
    tailer.commit()
    with log.open("a") as fh:
        fh.write("more\n")
    assert lines_of(LogTailer([log], state).read()) == ["more"]


def test_a_file_that_does_not_exist_yet_is_waited_for(tmp_path: Path):
    log = tmp_path / "later.log"
    tailer = LogTailer([log])
    assert tailer.read() == []
    log.write_text("hello\n")
    assert lines_of(tailer.read()) == ["hello"]


def test_binary_junk_and_odd_bytes_are_shipped_not_fatal(tmp_path: Path):
    log = tmp_path / "junk.log"
    log.write_bytes(b"\x00\xff\xfe\x89PNG\r\n" + "ok ✓\n".encode() + b"\xc3\x28 broken utf-8\n")
    records = LogTailer([log]).read(now=lambda: 1_796_210_000.0)
    assert len(records) == 3 and records[1]["line"] == "ok ✓"
    assert all(isinstance(decode("logs", __import__("msgspec").json.encode(r)), LogRecord) for r in records)


def test_a_glob_follows_torchruns_log_layout_as_it_appears(tmp_path: Path):
    """torchrun --log-dir D --redirects 3 names its run folder only at start; each rank's files carry its rank."""
    pattern = str(tmp_path / "logs" / "**" / "std*.log")
    state = tmp_path / "state.json"
    tailer = LogTailer([pattern], state, node="n1", job_id="77")
    assert tailer.read() == []  # nothing there yet: waited for
    for rank in (0, 2):
        folder = tmp_path / "logs" / "6d7d_bz0z" / "attempt_0" / str(rank)
        folder.mkdir(parents=True)
        (folder / "stderr.log").write_text(f"oops from {rank}\n")
        (folder / "stdout.log").write_text("")
    found = tailer.read()
    assert sorted((r["rank"], r["line"], r["job_id"]) for r in found) == [
        (0, "oops from 0", "77"),
        (2, "oops from 2", "77"),
    ]
    tailer.commit()
    tailer.close()
    # A prefix the line carries itself wins over the layout; a restart resumes where it stopped.
    with (tmp_path / "logs" / "6d7d_bz0z" / "attempt_0" / "2" / "stderr.log").open("a") as fh:
        fh.write("[rank6]: Traceback (most recent call last):\n")
    again = LogTailer([pattern], state, node="n1", job_id="77", rank_base=4)
    assert [(r["rank"], r["line"]) for r in again.read()] == [(6, "[rank6]: Traceback (most recent call last):")]
