"""A hang localised from the ranks' stacks: archived (opening, then revision), explained and shown with its groups."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from trainguard.cli.app import app
from trainguard.console.data import ConsoleData
from trainguard.dataflows.archive import ParquetArchiveSink, read_dataset
from trainguard.detectors.events import Anomaly, StackFrame, StacksRecord, ThreadStack
from trainguard.detectors.findings import Finding
from trainguard.detectors.hang_stacks import HangStacks
from trainguard.detectors.incidents import Incidents


def _dump(rank: int, *functions: str) -> StacksRecord:
    frames = [StackFrame(name="wait", filename="/usr/lib/python3.11/threading.py", line=320)]
    frames += [StackFrame(name=f, filename="/job/train.py", line=10 + i) for i, f in enumerate(functions)]
    return StacksRecord(
        ts=1070.0, job_id="4711", node=f"gpu-{rank // 2}", rank=rank, pid=900 + rank,
        threads=[ThreadStack(name="MainThread", tid=900 + rank, frames=frames)],
    )  # fmt: skip


def _opened_and_revised() -> list[Anomaly]:
    incidents = Incidents("job/4711", "4711", group_window_s=1200.0, straggler_cooldown_s=900.0)
    finding = Finding("hang", "no_progress", "unknown", 1000.0, 1060.0, evidence=["no step for 60 s after step 30"])
    (opened,) = incidents.emit([finding])
    view = HangStacks()
    for rank in range(4):
        view.observe(_dump(rank, "load_batch" if rank == 2 else "all_reduce", "train_step", "main"))
    (revised,) = view.on_advance([], incidents, 1080.0, 1000.0)
    return [opened, revised]


def test_explain_shows_the_stack_groups_of_a_localised_hang(tmp_path: Path) -> None:
    opened, revised = _opened_and_revised()
    part = ParquetArchiveSink(tmp_path, "anomalies").build_part("anomalies", "anomalies", None)
    part.write_batch([opened])
    part.write_batch([revised])  # published again, still open: the archive keeps the revision
    part.close()
    (row,) = read_dataset(tmp_path, "anomalies").to_dicts()
    assert row["localisation"] == "stacks" and row["ranks"] == [2] and len(row["stack_groups"]) == 2

    runner = CliRunner()
    shown = runner.invoke(app, ["explain", opened.anomaly_id, "--archive", str(tmp_path)])
    assert shown.exit_code == 0, shown.output
    text = shown.output
    assert "ranks named by stacks: 2" in text
    assert "stacks (the culprit named by stacks)" in text
    assert "4 processes in 2 groups" in text
    assert "3 processes (ranks 0, 1, 3) on gpu-0, gpu-1 in all_reduce ← train_step ← main" in text
    assert "outlier: rank 2 on gpu-1 in load_batch ← train_step ← main" in text
    assert "load_batch (train.py)" in text and "wait (threading.py)" in text  # a representative stack
    assert "stacks: rank 2 (gpu-1) in load_batch ← train_step ← main: outlier" in text  # and in the evidence

    report = json.loads(runner.invoke(app, ["explain", opened.anomaly_id, "--archive", str(tmp_path), "--json"]).output)
    assert report["localisation"] == "stacks"
    assert [(g["ranks"], g["outlier"]) for g in report["stack_groups"]] == [([0, 1, 3], False), ([2], True)]

    feed = ConsoleData(None, tmp_path)
    feed.refresh()
    (shown_row,) = feed.feed()
    assert shown_row["stack_groups"][1]["where"] == "load_batch ← train_step ← main"
