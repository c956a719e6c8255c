"""The action sink on a real four-node Slurm cluster: replayed faults → drains, requeues, holds."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import msgspec
import pytest

from tests.conftest import ROOT, replay
from tests.support import slurm_scenarios as scenarios
from tests.support.slurm_cluster import SlurmCluster
from tests.support.slurm_scenarios import settings
from trainguard.actions.audit import read_entries


def events(tmp_path: Path) -> list[tuple[str, str, str]]:
    return [(e["event"], e.get("action", ""), e.get("target", "")) for e in read_entries(tmp_path / "audit.jsonl")]


def test_enforce_drains_the_bad_node_and_the_job_runs_again_elsewhere(slurm: SlurmCluster, tmp_path: Path):
    job, nodes = slurm.submit(nodes=2)
    bad = nodes[1]
    result = replay(scenarios.xid79(tmp_path / "scenario", job, nodes, bad), settings(tmp_path))
    (crash,) = result.anomalies
    assert [(a.action, a.target, a.status) for a in result.actions] == [
        ("drain_node", bad, "applied"),
        ("requeue_job", job, "applied"),
    ]
    node = slurm.nodes()[bad]
    assert "DRAIN" in node["state_flags"] and "xid_79" in node["reason"] and crash.anomaly_id in node["reason"]
    slurm.wait_for(
        lambda: slurm.job(job)["job_state"] == "RUNNING" and slurm.job(job)["restart_cnt"] == 1, "rerun", job=job
    )
    rerun = slurm.job(job)
    assert bad not in rerun["nodes"] and bad in rerun["excluded_nodes"]
    assert events(tmp_path) == [
        ("intent", "drain_node", bad),
        ("applied", "drain_node", bad),
        ("intent", "requeue_job", job),
        ("applied", "requeue_job", job),
    ]
    applied = [e for e in read_entries(tmp_path / "audit.jsonl") if e["event"] == "applied"]
    assert all(e["detected_at"] <= e["decided_at"] <= e["applied_at"] and e["attempts"] for e in applied)


def test_monitor_mode_changes_nothing_and_audits_the_recommendation(slurm: SlurmCluster, tmp_path: Path):
    job, nodes = slurm.submit(nodes=2)
    before = slurm.job(job)
    result = replay(scenarios.xid79(tmp_path / "scenario", job, nodes, nodes[0]), settings(tmp_path, "monitor"))
    assert {(a.status, a.mode) for a in result.actions} == {("recommended", "monitor")}
    time.sleep(1.0)
    after = slurm.job(job)
    assert (after["job_state"], after["restart_cnt"], after["nodes"]) == ("RUNNING", 0, before["nodes"])
    assert not any("DRAIN" in n["state_flags"] for n in slurm.nodes().values())
    assert events(tmp_path) == [("recommended", "drain_node", nodes[0]), ("recommended", "requeue_job", job)]


def test_a_transient_nccl_timeout_requeues_without_draining(slurm: SlurmCluster, tmp_path: Path):
    job, nodes = slurm.submit(nodes=2)
    result = replay(scenarios.nccl_timeout(tmp_path / "scenario", job, nodes), settings(tmp_path))
    assert [(a.action, a.status) for a in result.actions] == [("requeue_job", "applied")], (result, slurm.job(job))
    slurm.wait_for(
        lambda: slurm.job(job)["restart_cnt"] >= 1 and slurm.job(job)["job_state"] == "RUNNING", "rerun", job=job
    )
    assert not any("DRAIN" in n["state_flags"] for n in slurm.nodes().values())


def test_a_repeated_application_error_holds_the_job_and_drains_nothing(slurm: SlurmCluster, tmp_path: Path):
    job, nodes = slurm.submit(nodes=2)
    result = replay(scenarios.app_error(tmp_path / "scenario", job, nodes), settings(tmp_path))
    assert ("hold_job", job, "applied") in [(a.action, a.target, a.status) for a in result.actions]
    assert not [a for a in result.actions if a.action == "drain_node"]
    slurm.wait_for(lambda: slurm.job(job)["job_state"] == "PENDING", "the job back in the queue")
    assert slurm.job(job)["priority"] == 0 and slurm.job(job)["state_reason"].startswith("JobHeld")
    assert not any("DRAIN" in n["state_flags"] for n in slurm.nodes().values())


def test_the_circuit_breaker_stops_a_storm_of_drains(slurm: SlurmCluster, tmp_path: Path):
    nodes = sorted(slurm.nodes())
    result = replay(scenarios.xid79_storm(tmp_path / "scenario", nodes), settings(tmp_path))
    statuses = {a.target: a.status for a in result.actions}
    drained = sorted(n for n, info in slurm.nodes().items() if "DRAIN" in info["state_flags"])
    assert len(drained) == 2 and all(statuses[n] == "applied" for n in drained)  # 50 % of the partition
    held_back = [a for a in result.actions if a.status == "recommended"]
    assert len(held_back) == 2 and all("circuit breaker open" in a.reason for a in held_back)
    (breaker,) = [e for e in read_entries(tmp_path / "audit.jsonl") if e["event"] == "breaker"]
    assert breaker["open"] is True


WRAPPER = """#!/bin/bash
# Runs the real Slurm tool, logging what actually ran; optionally stalls around drains.
tool=$(basename "$0")
if [[ "{stall}" == before && "$*" == *state=drain* ]]; then sleep 60; fi
/usr/bin/$tool "$@"; rc=$?
printf '%s\\n' "$tool $*" >> {log}
if [[ "{stall}" == after && "$*" == *state=drain* ]]; then sleep 60; fi
exit $rc
"""


def wrappers(directory: Path, log: Path, stall: str) -> str:
    directory.mkdir(parents=True)
    for tool in ("scontrol", "squeue", "sinfo", "scancel"):
        path = directory / tool
        path.write_text(WRAPPER.format(stall=stall, log=log))
        path.chmod(0o755)
    return str(directory)


def run_replay(scenario: Path, out: Path, config: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "trainguard.dataflows",
            "replay",
            str(scenario),
            "--out",
            str(out),
            "-c",
            str(config),
            "-q",
        ],
        cwd=ROOT,
        start_new_session=True,  # kill -9 the whole group, wrappers included: the machine dies
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


@pytest.mark.parametrize("stall", ["before", "after"])
def test_killed_between_intent_and_outcome_neither_repeats_nor_loses(slurm: SlurmCluster, tmp_path: Path, stall: str):
    import yaml

    job, nodes = slurm.submit(nodes=2)
    bad = nodes[0]
    scenario = scenarios.xid79(tmp_path / "scenario", job, nodes, bad)
    log = tmp_path / "commands.log"
    config = tmp_path / "config.yaml"

    def write_config(bin_dir: str) -> None:
        data = msgspec.to_builtins(settings(tmp_path, bin_dir=bin_dir))
        config.write_text(yaml.safe_dump(data))

    write_config(wrappers(tmp_path / "stalling", log, stall))
    proc = run_replay(scenario, tmp_path / "out1", config)
    deadline = time.monotonic() + 60

    def drain_ran() -> bool:
        return log.exists() and "state=drain" in log.read_text()

    while ("intent", "drain_node", bad) not in events(tmp_path) or (stall == "after" and not drain_ran()):
        assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read().decode() if proc.stderr else ""
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert ("applied", "drain_node", bad) not in events(tmp_path)
    drained_by_then = "DRAIN" in slurm.nodes()[bad]["state_flags"]
    assert drained_by_then == (stall == "after")

    write_config(wrappers(tmp_path / "plain", log, "never"))
    rerun = run_replay(scenario, tmp_path / "out2", config)
    assert rerun.wait(timeout=120) == 0, rerun.stderr.read().decode() if rerun.stderr else ""

    drains = [line for line in log.read_text().splitlines() if "state=drain" in line]
    requeues = [line for line in log.read_text().splitlines() if line.startswith("scontrol requeue")]
    assert len(drains) == 1 and len(requeues) == 1  # nothing lost, nothing repeated
    assert "DRAIN" in slurm.nodes()[bad]["state_flags"]
    slurm.wait_for(lambda: slurm.job(job)["restart_cnt"] == 1, "the requeue")
    outcomes = [e for e in read_entries(tmp_path / "audit.jsonl") if e["event"] == "applied"]
    assert sorted(e["action"] for e in outcomes) == ["drain_node", "requeue_job"]
    drain = next(e for e in outcomes if e["action"] == "drain_node")
    assert ("reconciled" in drain["reason"]) == (stall == "after")


def test_injected_names_from_telemetry_never_reach_a_command(slurm: SlurmCluster, tmp_path: Path):
    evil = ["gpu-node-01; touch /tmp/tg-pwned", "$(touch /tmp/tg-pwned)", "gpu-node-02\nreason=x", "`id`"]
    log = tmp_path / "commands.log"
    bin_dir = wrappers(tmp_path / "bin", log, "never")
    result = replay(scenarios.xid79_storm(tmp_path / "scenario", evil), settings(tmp_path, bin_dir=bin_dir))
    assert len(result.actions) == len(evil) and {a.status for a in result.actions} == {"failed"}
    assert all("not in the scheduler's inventory" in a.reason for a in result.actions)
    ran = log.read_text() if log.exists() else ""
    assert "update" not in ran and "pwned" not in ran and "`id`" not in ran
    assert not Path("/tmp/tg-pwned").exists()
    assert not any("DRAIN" in n["state_flags"] for n in slurm.nodes().values())


def test_watch_slurm_reports_job_and_node_changes(slurm: SlurmCluster, tmp_path: Path):
    from trainguard.actions.commands import CommandRunner
    from trainguard.agents.slurm_watcher import SlurmWatcher

    watcher = SlurmWatcher(CommandRunner(timeout_s=10, attempts=1))
    first = watcher.poll()
    assert {r["node"] for _, r in first if r["kind"] == "node"} == set(slurm.nodes())
    out = slurm.run(
        "sbatch",
        "--parsable",
        "--nodes=2",
        "--nodelist=gpu-node-[01,03]",
        f"--output={tmp_path}/job-%j.out",
        "--wrap",
        "srun sleep 1000",
    )
    job = out.strip()
    slurm.wait_for(lambda: slurm.job(job)["job_state"] == "RUNNING", "job running")
    slurm.run("scontrol", "update", "nodename=gpu-node-04", "state=drain", "reason=bad PSU (ticket 42)")
    records = [r for _, r in watcher.poll()]
    (running,) = [r for r in records if r["kind"] == "job" and r["job_id"] == job]
    assert running["state"] == "RUNNING" and running["nodes"] == ["gpu-node-01", "gpu-node-03"]
    drained = next(r for r in records if r.get("node") == "gpu-node-04")
    assert drained["state"] == "IDLE+DRAIN" and drained["reason"] == "bad PSU (ticket 42)"
    assert watcher.poll() == []  # nothing changed
    slurm.run("scancel", job)
    slurm.wait_for(lambda: slurm.job(job)["job_state"] == "CANCELLED", "job cancelled")
    (ended,) = [r for _, r in watcher.poll() if r["kind"] == "job"]
    assert ended["state"] == "CANCELLED" and ended["nodes"] == ["gpu-node-01", "gpu-node-03"]

    from typer.testing import CliRunner

    from trainguard.cli.app import app

    result = CliRunner().invoke(app, ["watch-slurm", "--out", str(tmp_path / "s.jsonl"), "--count", "1"])
    assert result.exit_code == 0, result.output
    lines = (tmp_path / "s.jsonl").read_text().splitlines()
    from trainguard.detectors.events import decode

    decoded = [decode("scheduler", line.encode()) for line in lines]
    assert len(decoded) >= 5 and all(type(d).__name__ in ("JobEvent", "NodeEvent") for d in decoded)
