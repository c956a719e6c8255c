"""The real flow over a replay directory with a ``stacks`` topic: a hang, the diagnose, the hang revised."""

from __future__ import annotations

import json
from pathlib import Path

from tests.conftest import replay
from trainguard.dataflows.archive import read_dataset

T0 = 1796205600.0
LAST_STEP = T0 + 60.0


def _write(directory: Path, name: str, records: list[dict]) -> None:
    (directory / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


def _stack(rank: int, function: str) -> dict:
    frames = [{"name": function, "filename": "/job/train.py", "line": 12}, {"name": "main", "filename": "train.py"}]
    return {
        "ts": LAST_STEP + 90.0 + rank * 0.1,
        "job_id": "77",
        "node": f"n{rank // 2 + 1}",
        "rank": rank,
        "pid": 500 + rank,
        "state": "sleeping",
        "threads": [{"name": "MainThread", "tid": 500 + rank, "frames": frames}],
        "request": "ac-1",
    }


def test_a_hang_is_published_again_localised_when_its_stacks_arrive(tmp_path: Path) -> None:
    _write(
        tmp_path, "scheduler", [{"ts": T0, "kind": "job", "job_id": "77", "state": "RUNNING", "nodes": ["n1", "n2"]}]
    )
    progress = [
        {"ts": T0 + 2 * step, "job_id": "77", "node": f"n{rank // 2 + 1}", "rank": rank, "step": step}
        for step in range(1, 31)
        for rank in range(4)
    ]
    _write(tmp_path, "progress", progress)
    stacks = [_stack(rank, "load_batch" if rank == 3 else "all_reduce") for rank in range(4)]
    _write(tmp_path, "stacks", [*stacks, {"ts": LAST_STEP + 91, "job_id": "77", "node": "n1", "threads": 5}])

    result = replay(tmp_path, archive=tmp_path / "out")
    opened, revised = [a for a in result.anomalies if a.kind == "hang"]
    assert opened.anomaly_id == revised.anomaly_id and opened.revised_at is None and opened.localisation is None
    assert (revised.ranks, revised.nodes, revised.localisation) == ([3], ["n2"], "stacks")
    assert revised.revised_at is not None and revised.summary.startswith("hang/no_progress (unknown) on n2")
    # The revision decided nothing new: one diagnose (applied, monitor mode) and one requeue for the hang.
    assert sorted((a.action, a.status) for a in result.actions) == [
        ("diagnose", "applied"),
        ("requeue_job", "recommended"),
    ]
    (dead,) = result.dead
    assert dead.topic == "stacks" and "$.threads" in dead.reason
    (row,) = read_dataset(tmp_path / "out", "anomalies").to_dicts()
    assert row["localisation"] == "stacks" and [g["ranks"] for g in row["stack_groups"]] == [[0, 1, 2], [3]]
