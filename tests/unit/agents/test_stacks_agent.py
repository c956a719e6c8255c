"""``collect-stacks``: the job's rank processes found in /proc, dumped with the real py-spy, requests answered once.

The processes are real (tests/support/stack_procs.py): a torchrun-like launcher without ``RANK``
that starts ranks 0 and 1, a rank 2 that forked a data-loader worker inheriting its
environment, and no rank 3 although ``LOCAL_WORLD_SIZE`` says four. All are stopped by PID.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.support.stack_procs import job_env, rank_processes
from trainguard.agents.jobprocs import job_processes
from trainguard.agents.stacks import PySpyMissing, StackAgent, dump_job, find_py_spy
from trainguard.cli.app import app
from trainguard.detectors.events import StacksRecord, decode
from trainguard.detectors.stacks import localise


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, dict[str, int]]]:
    """The job id, and the pids of its launcher, ranks 0-2 and rank 2's worker."""
    job_id = f"tg-agent-{os.getpid()}"
    with rank_processes(tmp_path_factory.mktemp("ranks")) as procs:
        launcher, (rank0, rank1) = procs.start(job_env(job_id, None, 4, "launcher") | {"TG_RANKS": "0,1"})
        rank2, (worker,) = procs.start(job_env(job_id, 2, 4, "with_worker"))
        procs.settle()
        yield job_id, {"launcher": launcher, "rank0": rank0, "rank1": rank1, "rank2": rank2, "worker": worker}


def test_the_ranks_are_found_and_launchers_workers_and_missing_ranks_told_apart(job) -> None:
    job_id, pids = job
    found = job_processes(job_id)
    assert [(p.rank, p.pid) for p in found] == [(0, pids["rank0"]), (1, pids["rank1"]), (2, pids["rank2"]), (3, None)]
    assert found[3].state == "gone" and found[0].expected == (0, 1, 2, 3)
    assert job_processes(job_id + "-other") == []


def test_dump_job_reads_every_rank_and_reports_the_missing_one(job) -> None:
    job_id, pids = job
    records = dump_job(job_id, "n7")
    assert [(r["rank"], r["pid"], r["state"]) for r in records] == [
        (0, pids["rank0"], "sleeping"),
        (1, pids["rank1"], "sleeping"),
        (2, pids["rank2"], "sleeping"),
        (3, None, "gone"),
    ]
    for record in records:
        assert isinstance(decode("stacks", json.dumps(record)), StacksRecord)
    assert records[3]["error"] == f"no process of job {job_id} has rank 3 on n7"
    verdict = localise(records)
    assert verdict.outlier_ranks == [3]  # ranks 0-2 wait in the same all_reduce; rank 3 is not there
    assert verdict.groups[0].ranks == [0, 1, 2] and verdict.groups[0].where.startswith("all_reduce")


def _diagnose(action_id: str, job_id: str, nodes: str = "", status: str = "applied") -> dict:
    return {
        "action_id": action_id,
        "anomaly_id": "an-1",
        "action": "diagnose",
        "target": job_id,
        "params": {"nodes": nodes},
        "status": status,
        "decided_at": 1e12,  # in the future of any clock: never too old
    }


def test_each_diagnose_is_answered_once_and_a_job_not_too_often(job) -> None:
    job_id, _ = job
    agent = StackAgent("n7", min_interval_s=30.0)
    answer = agent.on_action(_diagnose("ac-1", job_id))
    assert [r["rank"] for r in answer] == [0, 1, 2, 3] and {r["request"] for r in answer} == {"ac-1"}
    assert agent.on_action(_diagnose("ac-1", job_id)) == []  # the same action again (at-least-once delivery)
    assert agent.on_action(_diagnose("ac-2", job_id)) == []  # another request within min_interval_s
    assert agent.on_action(_diagnose("ac-3", job_id, status="recommended")) == []
    assert agent.on_action({**_diagnose("ac-4", job_id), "action": "drain_node"}) == []
    assert StackAgent("n7", job="another").on_action(_diagnose("ac-5", job_id)) == []  # --job: that job only
    stale = StackAgent("n7").on_action({**_diagnose("ac-6", job_id), "decided_at": 1000.0})
    assert stale == []  # the moment passed


def test_a_named_node_without_the_job_says_so(job) -> None:
    agent = StackAgent("n7")
    (gone,) = agent.on_action(_diagnose("ac-9", "no-such-job", nodes="n3,n7"))
    assert (gone["state"], gone["node"], gone["request"]) == ("gone", "n7", "ac-9")
    assert isinstance(decode("stacks", json.dumps(gone)), StacksRecord)
    assert StackAgent("n7").on_action(_diagnose("ac-10", "no-such-job", nodes="n3")) == []  # not named, not here


def test_py_spy_is_found_beside_python_or_refused_in_one_sentence(tmp_path: Path) -> None:
    assert Path(find_py_spy()).name == "py-spy"
    with pytest.raises(PySpyMissing, match=r"^--py-spy .* is not an executable file; give the path of py-spy\.$"):
        find_py_spy(tmp_path / "nope")


def test_collect_stacks_once_writes_the_records(job, tmp_path: Path) -> None:
    job_id, _ = job
    out = tmp_path / "stacks.jsonl"
    runner = CliRunner()
    done = runner.invoke(app, ["collect-stacks", "--job", job_id, "--once", "--out", str(out), "--node", "n7"])
    assert done.exit_code == 0, done.output
    assert f"dumped 4 process(es) of job {job_id} on n7" in done.output
    assert "rank 3 (n7): process gone" in done.output
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["rank"] for r in records] == [0, 1, 2, 3]
    missing = runner.invoke(app, ["collect-stacks", "--once", "--out", str(out)])
    assert missing.exit_code == 2 and "--once dumps one job: give --job ID." in missing.output
    nospy = runner.invoke(app, ["collect-stacks", "--job", job_id, "--once", "--py-spy", str(tmp_path / "x")])
    assert nospy.exit_code == 2 and "is not an executable file" in nospy.output
