"""Labelled scenarios, scoring, and the generate → replay → score loop."""

from __future__ import annotations

import hashlib
import json
import tracemalloc
from collections import defaultdict
from pathlib import Path

import msgspec
import pytest
from typer.testing import CliRunner

from tests.conftest import replay
from trainguard.cli.app import app
from trainguard.datasets.generator import BENIGN, FAULTS, build, stream, write_scenario
from trainguard.datasets.scoring import load_labels, score

runner = CliRunner()


def _digest(directory: Path) -> str:
    h = hashlib.sha256()
    for name in sorted(p.name for p in directory.iterdir()):
        h.update((directory / name).read_bytes())
    return h.hexdigest()


def test_same_seed_same_scenario_other_seed_other_scenario(tmp_path: Path):
    write_scenario("default", 5, tmp_path / "a", minutes=15)
    write_scenario("default", 5, tmp_path / "b", minutes=15)
    write_scenario("default", 6, tmp_path / "c", minutes=15)
    assert _digest(tmp_path / "a") == _digest(tmp_path / "b") != _digest(tmp_path / "c")


def test_scenarios_generated_in_worker_processes_are_those_generated_here(tmp_path: Path):
    from trainguard.cli.scenarios import prepare_scenarios

    here = prepare_scenarios("default", [21, 22, 21], tmp_path / "here", minutes=10, processes=1)
    apart = prepare_scenarios("default", [21, 22, 21], tmp_path / "apart", minutes=10, processes=3)  # 21 once
    assert [_digest(d) for d, _ in apart] == [_digest(d) for d, _ in here]
    assert [labels for _, labels in apart] == [labels for _, labels in here] and here[0][1] != here[1][1]


def test_default_preset_has_every_fault_and_every_benign_confounder():
    sim = build("default", 1)
    list(stream(sim))
    names = {label["fault"] for label in sim.labels}
    assert set(FAULTS) <= names and set(BENIGN) <= names
    lemon = [label for label in sim.labels if label["fault"] == "lemon_node"]
    assert len({label["job_id"] for label in lemon}) == 3 and len({label["nodes"][0] for label in lemon}) == 1


def test_stream_is_time_ordered_and_follows_the_physics():
    sim = build("default", 2, minutes=20)
    last = defaultdict(float)
    step_times: dict[tuple[str, int], set[float]] = defaultdict(set)
    from trainguard.detectors.events import parse_ts

    for topic, record in stream(sim):
        ts = parse_ts(record["ts"])
        assert ts >= last[topic] - 0.5, (topic, record)  # per-sample jitter of under half a second
        last[topic] = max(last[topic], ts)
        if topic == "progress":
            step_times[(record["job_id"], record["step"])].add(record["step_time_s"])
    # Synchronous training: every rank of a step reports the same step time.
    assert step_times and all(len(times) == 1 for times in step_times.values())


def test_generation_memory_does_not_grow_with_the_scenario_length():
    def peak(minutes: float) -> int:
        sim = build("scale", 1, nodes=64, minutes=minutes)
        tracemalloc.start()
        for _ in stream(sim):
            pass
        _current, top = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        return top

    short, long = peak(10), peak(40)
    assert long < short * 1.5, (short, long)


def _label(**kw):
    base = {
        "fault_id": "f1",
        "fault": "xid79",
        "kind": "crash",
        "category": "xid_79",
        "layer": "hardware",
        "onset": 1000.0,
        "job_id": "7",
        "nodes": ["n1"],
        "ranks": [],
        "gpus": [],
    }
    return {**base, **kw}


def _anomaly(**kw):
    base = {
        "anomaly_id": "a1",
        "kind": "crash",
        "category": "xid_79",
        "layer": "hardware",
        "job_id": "7",
        "nodes": ["n1"],
        "detected_at": 1000.5,
    }
    return {**base, **kw}


def test_scoring_by_hand():
    labels = [
        _label(),
        _label(fault_id="f2", kind="hang", category="no_progress", layer="unknown", job_id="8", nodes=["n5"]),
        _label(fault_id="b1", fault="user_cancel", kind="benign", category="user_cancel", job_id="9", nodes=[]),
    ]
    anomalies = [
        _anomaly(),
        _anomaly(
            anomaly_id="a2",
            kind="hang",
            category="no_progress",
            layer="unknown",
            job_id="8",
            nodes=["n6"],
            detected_at=1060.0,
        ),
        _anomaly(anomaly_id="a3", kind="hang", job_id="9", nodes=[], detected_at=1100.0),  # on a benign cancel
    ]
    actions = [
        {"action": "drain_node", "target": "n1", "anomaly_id": "a1"},
        {"action": "drain_node", "target": "n6", "anomaly_id": "a2"},
    ]
    report = score(labels, anomalies, actions)
    crash, hang = report["by_kind"]["crash"], report["by_kind"]["hang"]
    assert crash["recall"] == 1.0 and crash["precision"] == 1.0 and crash["latency_p50_s"] == 0.5
    assert hang["recall"] == 1.0 and hang["precision"] == 0.5 and hang["localisation"] == 0.0
    assert [fp["anomaly_id"] for fp in report["false_positives"]] == ["a3"]
    assert report["actions"]["correct_drains"] == 1
    assert [w["target"] for w in report["actions"]["wrongful"]] == ["n6"]
    late = score([_label()], [_anomaly(detected_at=1000.0 + 3600)])
    assert late["by_kind"]["crash"]["recall"] == 0.0 and len(late["missed"]) == 1


def test_generate_replay_score_end_to_end(tmp_path: Path):
    write_scenario("default", 21, tmp_path, minutes=30)
    result = replay(tmp_path)
    report = score(
        load_labels(tmp_path / "labels.jsonl"),
        [msgspec.structs.asdict(a) for a in result.anomalies],
        [msgspec.structs.asdict(a) for a in result.actions],
    )
    for kind in ("crash", "hang", "numerics", "node_unhealthy", "straggler"):
        assert report["by_kind"][kind]["recall"] == 1.0, (kind, report["missed"])
        assert report["by_kind"][kind]["precision"] == 1.0, (kind, report["false_positives"])
    assert report["actions"]["wrongful"] == []


def test_cli_generate_score_and_tune(tmp_path: Path):
    out = tmp_path / "scenario"
    result = runner.invoke(
        app,
        ["generate", "--preset", "default", "--seed", "4", "--minutes", "20", "--format", "parquet", "--out", str(out)],
    )
    assert result.exit_code == 0, result.output
    assert (out / "gpu.parquet").is_file() and (out / "labels.jsonl").is_file()
    assert runner.invoke(app, ["replay", str(out), "--out", str(tmp_path / "o"), "-q"]).exit_code == 0
    scored = runner.invoke(
        app,
        [
            "score",
            "--labels",
            str(out / "labels.jsonl"),
            "--anomalies",
            str(tmp_path / "o" / "anomalies"),
            "--actions",
            str(tmp_path / "o" / "actions"),
            "--json",
        ],
    )
    assert scored.exit_code == 0, scored.output
    assert json.loads(scored.output)["by_kind"]["crash"]["recall"] == 1.0
    tuned = tmp_path / "tuned.yaml"
    tune = ["tune", "--param", "detectors.hang.floor_s=55,300", "--seeds", "4", "--minutes", "20"]
    tune += ["--work", str(tmp_path / "work"), "--out", str(tuned)]
    result = runner.invoke(app, [*tune, "--processes", "1"])
    assert result.exit_code == 0, result.output
    # A 300 s floor reports hangs five minutes late: the 55 s setting wins on latency at equal F1.
    assert "floor_s: 55" in tuned.read_text()
    # The same sweep with its replays in two worker processes: the same table, the same choice.
    in_two = runner.invoke(app, [*tune, "--processes", "2"])
    assert in_two.exit_code == 0, in_two.output
    assert in_two.output == result.output and "floor_s: 55" in tuned.read_text()
    bad = runner.invoke(app, ["tune", "--param", "detectors.hang.nope=1", "--seeds", "4"])
    assert bad.exit_code == 2 and "no setting 'nope'" in bad.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["generate", "--preset", "huge", "--out", "x"], "unknown preset"),
        (["generate", "--format", "csv", "--out", "x"], "--format must be"),
        (["score", "--labels", "nope.jsonl", "--anomalies", "."], "labels file"),
        (["evaluate", "--seeds", "a,b"], "comma-separated integers"),
    ],
)
def test_scenario_commands_refuse_bad_arguments_in_one_sentence(args: list[str], message: str):
    result = runner.invoke(app, args)
    assert result.exit_code == 2 and message in result.output


def test_a_malformed_labels_file_is_one_sentence(tmp_path: Path):
    labels = tmp_path / "labels.jsonl"
    labels.write_bytes(b'{"fault_id": "f1", "onset_ts": "2026-12-01T10:00:00Z"}\n\x00\xffjunk\n')
    (tmp_path / "anomalies").mkdir()
    result = runner.invoke(app, ["score", "--labels", str(labels), "--anomalies", str(tmp_path / "anomalies")])
    assert result.exit_code == 2 and "line 1 is not a label" in result.output


@pytest.mark.slow
def test_the_adversarial_preset_holds_on_a_seed_never_used_while_tuning(tmp_path: Path):
    """Benign pauses without markers, faults right after them, odd exporters, catalogue Xids (seed 202)."""
    write_scenario("adversarial", 202, tmp_path, minutes=45)
    result = replay(tmp_path)
    report = score(
        load_labels(tmp_path / "labels.jsonl"),
        [msgspec.structs.asdict(a) for a in result.stream],
        [msgspec.structs.asdict(a) for a in result.actions],
    )
    for kind, s in report["by_kind"].items():
        if s["labelled"]:
            assert s["recall"] >= 0.95, (kind, report["missed"])
        if s["anomalies"]:
            assert s["precision"] >= 0.95, (kind, report["false_positives"])
    assert report["benign_alarms"] == [] and report["actions"]["wrongful"] == []
