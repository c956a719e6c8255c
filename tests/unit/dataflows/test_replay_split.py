"""A replay split by shard gives each worker process exactly what it would have kept from the whole."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import DEMO_DIR, replay, summary
from trainguard.dataflows.config import Settings
from trainguard.dataflows.flow import Outputs, build_flow
from trainguard.dataflows.processes import run_processes
from trainguard.dataflows.replay import ReplayError
from trainguard.dataflows.replay_shards import ShardedReplaySource, shard_events
from trainguard.dataflows.replay_split import shard_folder, split_events, split_records, split_replay
from trainguard.datasets import generator
from trainguard.detectors.events import Anomaly, DeadLetter
from trainguard.detectors.frames import GpuFrame


@pytest.fixture(scope="module")
def scenario(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("scenario")
    generator.write_scenario("default", 7, directory, minutes=20)
    # Odd records too: the decoder's dead letters travel with their reasons, the lenient reads as they were.
    with (directory / "progress.jsonl").open("ab") as fh:
        fh.write(b'{not json\n{"ts": 1796205600, "node": "gpu-node-01", "rank": 0, "step": 1}\n')
    return directory


def _comparable(stream) -> list[tuple]:
    out: list[tuple] = []
    for key, item in stream:
        if item is None:
            out.append((key, None))
        elif type(item) is DeadLetter:
            out.append((key, "dead", item.topic, item.offset, item.reason, item.payload))
        elif type(item.event) is GpuFrame:
            e = item.event
            out.append((key, item.order, item.payload, e.ts, e.node, e.gpus, e.values.tobytes(), e.rare, e.uuid))
        else:
            out.append((key, item.order, item.payload, item.event))
    return out


@pytest.mark.parametrize("shards", [1, 2, 3])
def test_each_shard_reads_back_exactly_what_it_would_keep_from_the_whole(scenario: Path, tmp_path: Path, shards: int):
    held = split_replay(scenario, shards, tmp_path)
    assert all(n > 0 for n in held) and split_records(tmp_path) > max(held)
    for shard in range(shards):
        folder = shard_folder(tmp_path, shard, shards)
        assert folder is not None
        whole = _comparable(shard_events(scenario, shard, shards))
        assert _comparable(split_events(folder)) == whole
        assert any(item[1] == "dead" for item in whole) == (shard == 0)  # dead letters: shard 0 alone


def test_worker_processes_on_a_split_replay_match_one_worker_on_the_whole(scenario: Path, tmp_path: Path):
    one = replay(scenario)
    split_replay(scenario, 2, tmp_path)
    anomalies: list[Anomaly] = []
    actions: list = []
    dead: list[DeadLetter] = []
    outputs = Outputs(on_anomalies=anomalies.extend, on_actions=actions.extend, on_dead_letters=dead.extend)
    run_processes(lambda o: build_flow(ShardedReplaySource(tmp_path), Settings(), o), 2, outputs, timeout_s=300)
    assert len(one.anomalies) > 10
    assert summary(anomalies) == summary(one.stream)
    assert sorted(a.action_id for a in actions) == sorted(a.action_id for a in one.actions)
    assert sorted((d.topic, d.offset, d.payload, d.reason) for d in dead) == sorted(
        (d.topic, d.offset, d.payload, d.reason) for d in one.dead
    )


def test_a_split_replay_is_replayed_with_as_many_processes_as_shards(tmp_path: Path):
    split_replay(DEMO_DIR, 2, tmp_path)
    with pytest.raises(ReplayError, match=r"split into 2 shards: replay it with --processes 2"):
        shard_folder(tmp_path, 0, 3)
    assert shard_folder(DEMO_DIR, 0, 2) is None  # not split: every worker reads the whole
    with pytest.raises(ReplayError, match=r"--shards must be 1 or more"):
        split_replay(DEMO_DIR, 0, tmp_path / "none")


def test_the_cli_splits_and_says_what_to_fix(tmp_path: Path):
    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "trainguard.dataflows", *args]
        return subprocess.run(command, capture_output=True, text=True, timeout=120)

    split = ("split-replay", str(DEMO_DIR), "--out", str(tmp_path / "s"), "--shards", "2")
    done = cli(*split)
    assert done.returncode == 0 and "--processes 2" in done.stdout
    wrong = cli("replay", str(tmp_path / "s"), "-q")
    assert wrong.returncode == 2 and "replay it with --processes 2" in wrong.stderr
    again = cli(*split)
    assert again.returncode == 2 and "split into an empty directory" in again.stderr


def test_a_split_directory_with_topic_files_or_a_bad_speed_is_refused(tmp_path: Path):
    split_replay(DEMO_DIR, 2, tmp_path)
    with pytest.raises(ReplayError, match=r"--speed must be a positive number"):
        ShardedReplaySource(tmp_path, speed=0)
    (tmp_path / "logs.jsonl").write_bytes(b"")
    with pytest.raises(ReplayError, match=r"holds both a split replay .* and topic files"):
        shard_folder(tmp_path, 0, 2)


def test_a_split_without_its_summary_says_to_split_again(tmp_path: Path):
    split_replay(DEMO_DIR, 2, tmp_path)
    (tmp_path / "split.json").unlink()
    with pytest.raises(ReplayError, match=r"split.json is missing or unreadable: split the replay again"):
        split_records(tmp_path)
