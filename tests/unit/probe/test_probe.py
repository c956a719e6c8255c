"""The progress probe: what it publishes, and that it never makes training wait."""

from __future__ import annotations

import time
from types import SimpleNamespace

import msgspec
import pytest

from trainguard.detectors.events import ProgressRecord, decode
from trainguard.probe import HFProgressCallback, ProgressProbe


def test_records_follow_the_contract_and_take_slurm_and_torchrun_defaults(tmp_path, monkeypatch):
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    monkeypatch.setenv("SLURMD_NODENAME", "gpu-node-07")
    monkeypatch.setenv("RANK", "5")
    probe = ProgressProbe(path=tmp_path / "p.jsonl")
    for step in range(1, 4):
        probe.step(step, step_time_s=1.0, compute_time_s=0.7, tokens_per_s=9000)
    probe.close()
    records = [decode("progress", line) for line in (tmp_path / "p.jsonl").read_bytes().splitlines()]
    assert [r.step for r in records] == [1, 2, 3] and all(isinstance(r, ProgressRecord) for r in records)
    assert (records[0].job_id, records[0].node, records[0].rank, records[0].compute_time_s) == (
        "4242",
        "gpu-node-07",
        5,
        0.7,
    )


def test_a_stalled_sink_drops_and_counts_instead_of_blocking(tmp_path):
    probe = ProgressProbe(job_id="1", node="n", rank=0, path=tmp_path / "p.jsonl", max_queue=10)
    stall = probe._file.write
    probe._file.write = lambda data: (time.sleep(0.5), stall(data))
    started = time.perf_counter()
    for step in range(1000):
        probe.step(step)
    elapsed = time.perf_counter() - started
    assert probe.dropped >= 980  # 10 queued (+1 in flight), the rest dropped and counted
    assert elapsed < 0.5  # the calls returned while the sink was still stuck on its first write
    probe.close(timeout_s=0.1)


def test_the_probe_survives_a_failing_sink(tmp_path):
    probe = ProgressProbe(job_id="1", node="n", rank=0, path=tmp_path / "p.jsonl")
    probe._file.write = lambda data: 1 / 0
    probe.step(1)
    probe.close()
    assert probe.errors == 1 and probe.sent == 0


def test_hugging_face_callback_reports_global_steps(tmp_path):
    probe = ProgressProbe(job_id="7", node="n", rank=0, path=tmp_path / "p.jsonl")
    callback = HFProgressCallback(probe)
    callback.on_init_end(None, None, None)  # hooks the Trainer calls that we ignore exist too
    for step in (1, 2):
        callback.on_step_begin(None, SimpleNamespace(global_step=step - 1), None)
        callback.on_step_end(None, SimpleNamespace(global_step=step), None)
    callback.on_train_end(None, None, None)
    lines = (tmp_path / "p.jsonl").read_bytes().splitlines()
    assert [msgspec.json.decode(x)["step"] for x in lines] == [1, 2]
    assert all(msgspec.json.decode(x)["step_time_s"] >= 0 for x in lines)


def test_needs_somewhere_to_publish(monkeypatch):
    monkeypatch.delenv("TRAINGUARD_BROKERS", raising=False)
    with pytest.raises(ValueError, match="needs brokers="):
        ProgressProbe(job_id="1", node="n", rank=0)


def test_a_quiet_rank_beats_and_every_record_names_its_process(tmp_path):
    import os

    probe = ProgressProbe(job_id="1", node="n", rank=2, path=tmp_path / "p.jsonl", beat_s=0.1)
    probe.step(7, step_time_s=0.2)
    time.sleep(0.45)  # blocked in a collective, say: no step, but the process lives
    probe.close()
    records = [decode("progress", line) for line in (tmp_path / "p.jsonl").read_bytes().splitlines()]
    assert not records[0].beat and records[0].step == 7
    beats = records[1:]
    assert len(beats) >= 2 and all(r.beat and r.step == 7 for r in beats)
    assert {r.pid for r in records} == {os.getpid()}


def test_beats_can_be_switched_off(tmp_path):
    probe = ProgressProbe(job_id="1", node="n", rank=0, path=tmp_path / "p.jsonl", beat_s=0)
    probe.step(1)
    time.sleep(0.2)
    probe.close()
    assert len((tmp_path / "p.jsonl").read_bytes().splitlines()) == 1
