"""The command line as a user meets it: the demo, and one-sentence errors for wrong input."""

from __future__ import annotations

from pathlib import Path

import polars as pl
from typer.testing import CliRunner

from trainguard.cli.app import app
from trainguard.dataflows.archive import read_dataset
from trainguard.dataflows.config import load_settings

runner = CliRunner()


def test_demo_reports_the_bundled_faults_and_writes_parquet(tmp_path: Path):
    result = runner.invoke(app, ["demo", "--out", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    assert "Found 4 of the 4 labelled faults" in result.output
    assert "Parquet archive" in result.output
    archived = pl.scan_parquet(tmp_path / "out" / "anomalies" / "**" / "*.parquet").collect()
    assert archived.filter(pl.col("resolved_at").is_null()).height == 5  # opened; resolutions come as more rows
    assert read_dataset(tmp_path / "out", "anomalies").height == 5


def test_replay_with_config_env_and_quiet(tmp_path: Path, monkeypatch):
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text("detectors:\n  hang:\n    floor_s: 30\nrouter:\n  tick_s: 1\n")
    monkeypatch.setenv("TRAINGUARD_CONFIG", str(cfg))
    from tests.conftest import DEMO_DIR

    result = runner.invoke(app, ["replay", str(DEMO_DIR), "--quiet"])
    assert result.exit_code == 0, result.output
    assert "5 anomalies" in result.output


def test_replay_on_worker_processes_finds_what_one_worker_finds(tmp_path: Path):
    from tests.conftest import DEMO_DIR

    one = runner.invoke(app, ["replay", str(DEMO_DIR), "--quiet"])
    two = runner.invoke(app, ["replay", str(DEMO_DIR), "--quiet", "--processes", "2", "--out", str(tmp_path)])
    assert two.exit_code == 0, two.output
    assert "5 anomalies" in one.output and "5 anomalies" in two.output
    assert read_dataset(tmp_path, "anomalies").height == 5  # the archive, written by a worker process
    both = runner.invoke(app, ["replay", str(DEMO_DIR), "-p", "2", "-w", "2"])
    assert _one_sentence_error(both).startswith("error: use --processes or --workers")


def test_hash_password_reads_stdin_and_the_console_refuses_a_malformed_hash(tmp_path: Path):
    from trainguard.console.passwords import verify_password

    result = runner.invoke(app, ["hash-password"], input="a long console password\n")
    assert result.exit_code == 0, result.output
    stored = result.output.strip()
    assert verify_password(stored, "a long console password") and not verify_password(stored, "another one")
    assert "at least 12" in _one_sentence_error(runner.invoke(app, ["hash-password"], input="short\n"))
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text("console:\n  users:\n    - {name: alice, role: operator, password_scrypt: 'scrypt$1$2'}\n")
    line = _one_sentence_error(runner.invoke(app, ["console", "-c", str(cfg), "--archive", str(tmp_path)]))
    assert "console user 'alice': password_scrypt is not of the form" in line


def _one_sentence_error(result) -> str:
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), result.output
    return lines[0]


def test_bad_config_values_are_one_sentence(tmp_path: Path):
    cfg = tmp_path / "bad.yaml"
    cfg.write_text("router:\n  lateness_s: soon\n")
    line = _one_sentence_error(runner.invoke(app, ["replay", str(tmp_path), "--config", str(cfg)]))
    assert "router.lateness_s must be a number (not 'soon')" in line
    cfg.write_text("policy:\n  mode: enforced\n")  # a typo must never switch a cluster to enforce
    line = _one_sentence_error(runner.invoke(app, ["replay", str(tmp_path), "-c", str(cfg)]))
    assert "policy.mode must be one of enforce, monitor (not 'enforced')" in line
    cfg.write_text("policy:\n  mdoe: enforce\n")
    line = _one_sentence_error(runner.invoke(app, ["replay", str(tmp_path), "-c", str(cfg)]))
    assert "policy has no setting mdoe; did you mean mode?" in line
    cfg.write_text("policy:\n  scopes:\n    - {mode: enforce}\n")
    assert "neither a partition nor a job" in _one_sentence_error(
        runner.invoke(app, ["replay", str(tmp_path), "-c", str(cfg)])
    )
    cfg.write_text("policy:\n  breaker:\n    max_partition_fraction: 1.5\n")
    assert "max_partition_fraction" in _one_sentence_error(
        runner.invoke(app, ["replay", str(tmp_path), "-c", str(cfg)])
    )
    cfg.write_text("detectors:\n  hang:\n    flor_s: 3\n")
    assert "did you mean floor_s?" in _one_sentence_error(runner.invoke(app, ["replay", str(tmp_path), "-c", str(cfg)]))
    for setting, value, rule in [
        ("hang:\n    floor_s", "-5", "must be >= 0"),
        ("straggler:\n    ratio", "0.5", "must be > 1"),
    ]:
        cfg.write_text(f"detectors:\n  {setting}: {value}\n")
        line = _one_sentence_error(runner.invoke(app, ["replay", str(tmp_path), "-c", str(cfg)]))
        assert f"{rule} (not {value})" in line
    cfg.write_text("[1, 2\n")
    assert "not valid YAML" in _one_sentence_error(runner.invoke(app, ["replay", str(tmp_path), "-c", str(cfg)]))
    line = _one_sentence_error(runner.invoke(app, ["replay", str(tmp_path), "-c", str(tmp_path / "none.yaml")]))
    assert "does not exist" in line


def test_bad_arguments_are_one_sentence(tmp_path: Path):
    assert "holds none of" in _one_sentence_error(runner.invoke(app, ["replay", str(tmp_path)]))
    assert "positive" in _one_sentence_error(runner.invoke(app, ["replay", str(tmp_path / "x"), "--speed", "-1"]))
    assert "no Kafka brokers" in _one_sentence_error(runner.invoke(app, ["run"], env={"TRAINGUARD_BROKERS": ""}))
    line = _one_sentence_error(runner.invoke(app, ["run", "--brokers", "127.0.0.1:1", "--topic", "bogus"]))
    assert "STREAM=TOPIC" in line
    (tmp_path / "a.log").write_text("no stamps here\n")
    line = _one_sentence_error(runner.invoke(app, ["import-logs", str(tmp_path / "a.log"), "--out", str(tmp_path)]))
    assert "no line with a timestamp" in line
    assert "unknown preset" in _one_sentence_error(
        runner.invoke(app, ["generate", "--preset", "nope", "--out", str(tmp_path)])
    )


def test_defaults_load_without_a_file():
    settings = load_settings(None)
    assert settings.policy.mode == "monitor" and settings.detectors.hang.factor == 5.0


def test_audit_command_filters_by_node_job_and_time(tmp_path: Path):
    from tests.conftest import DEMO_DIR

    cfg = tmp_path / "config.yaml"
    cfg.write_text(f"audit_log: {tmp_path / 'audit.jsonl'}\n")
    assert runner.invoke(app, ["replay", str(DEMO_DIR), "-q", "-c", str(cfg)]).exit_code == 0
    result = runner.invoke(app, ["audit", "-c", str(cfg), "--node", "gpu-node-04", "--parquet", str(tmp_path / "a.pq")])
    assert result.exit_code == 0, result.output
    # The drain, its repeat folded by the cooldown, and the requeue of the job that crashed there.
    assert "Audit trail (3 entries)" in result.output and "suppressed" in result.output
    assert pl.read_parquet(tmp_path / "a.pq").height == 7  # the whole log: with the hang's diagnose (applied)
    job = runner.invoke(app, ["audit", "--log", str(tmp_path / "audit.jsonl"), "--job", "1002", "--since", "1h"])
    assert "Audit trail (2 entries)" in job.output
    future = runner.invoke(app, ["audit", "--log", str(tmp_path / "audit.jsonl"), "--since", "2100-01-01T00:00:00Z"])
    assert "Audit trail (0 entries)" in future.output
    assert "neither a duration" in _one_sentence_error(
        runner.invoke(app, ["audit", "--log", str(tmp_path / "audit.jsonl"), "--since", "yesterday"])
    )
    assert "does not exist" in _one_sentence_error(runner.invoke(app, ["audit", "--log", str(tmp_path / "no.jsonl")]))


def test_config_init_writes_a_starter_that_loads_to_the_defaults_and_show_says_where_values_come_from(
    tmp_path: Path,
) -> None:
    import json

    from trainguard.dataflows.config import Settings, load_settings

    starter = tmp_path / "tg.yaml"
    assert runner.invoke(app, ["config", "init", str(starter)]).exit_code == 0
    assert load_settings(starter) == Settings()  # commented, and exactly the defaults
    assert "--force" in _one_sentence_error(runner.invoke(app, ["config", "init", str(starter)]))
    starter.write_text(starter.read_text().replace("floor_s: 55.0", "floor_s: 70.0"))
    shown = runner.invoke(
        app, ["config", "show", "-c", str(starter), "--json"], env={"TRAINGUARD_BROKERS": "kafka-1:9092"}
    )
    rows = {r["setting"]: r for r in map(json.loads, shown.output.splitlines())}
    assert rows["detectors.hang.floor_s"] == {
        "setting": "detectors.hang.floor_s",
        "value": 70.0,
        "source": f"file {starter}",
    }
    assert rows["detectors.hang.factor"]["source"] == "default"
    assert rows["kafka.brokers"] == {
        "setting": "kafka.brokers",
        "value": "kafka-1:9092",
        "source": "environment TRAINGUARD_BROKERS",
    }


def test_demo_keeps_its_audit_log_and_explain_tells_the_whole_story(tmp_path: Path) -> None:
    import json

    from trainguard.dataflows.archive import read_dataset

    out = tmp_path / "demo"
    first = runner.invoke(app, ["demo", "--out", str(out)])
    assert first.exit_code == 0 and (out / "audit.jsonl").is_file(), first.output
    anomalies = read_dataset(out, "anomalies")
    (xid,) = anomalies.filter(category="xid_79")["anomaly_id"].to_list()
    assert xid in first.output  # ids are printed, so an operator can ask about one
    shown = runner.invoke(app, ["explain", xid, "--archive", str(out)])
    assert shown.exit_code == 0, shown.output
    for expected in ("Xid 79: GPU has fallen off the bus", "NVIDIA: RESTART_BM", "signature nvrm_xid_79", "runbook"):
        assert expected in shown.output
    report = json.loads(runner.invoke(app, ["explain", xid, "--archive", str(out), "--json"]).output)
    assert report["xid"]["immediate_resolution"] == "RESTART_BM"
    assert {(d["action"], d["status"]) for d in report["decisions"]} == {
        ("drain_node", "recommended"),
        ("requeue_job", "recommended"),
    }
    (hang,) = anomalies.filter(kind="hang")["anomaly_id"].to_list()
    hang_report = json.loads(runner.invoke(app, ["explain", hang, "--archive", str(out), "--json"]).output)
    assert hang_report["rule"].startswith("hang rule: no progress past max(55 s")
    assert "no anomaly 'nope'" in _one_sentence_error(runner.invoke(app, ["explain", "nope", "--archive", str(out)]))
    again = runner.invoke(app, ["demo", "--out", str(out)])  # the same run again: its actions are already decided
    assert "actions: none new" in again.output and "a re-run" in again.output


def test_replay_json_lines_and_strict_exit_code(tmp_path: Path) -> None:
    import json

    from tests.conftest import DEMO_DIR

    lines = runner.invoke(app, ["replay", str(DEMO_DIR), "--json"]).output.splitlines()
    records = [json.loads(line) for line in lines]  # nothing but JSON on stdout
    summary = records[-1]
    assert summary["record"] == "summary" and summary["dead_lettered"] == 0
    kinds = {r["kind"] for r in records if r["record"] == "anomaly"}
    assert kinds == {"crash", "hang", "straggler", "node_unhealthy"}
    assert sum(r["record"] == "action" for r in records) == summary["actions"] > 0
    (tmp_path / "logs.jsonl").write_text(
        '{"ts": 1796205600, "job_id": "1", "node": "n1", "line": "step 1"}\n{"ts": "yesterday", "node": "n1"}\n'
    )
    assert runner.invoke(app, ["replay", str(tmp_path), "-q"]).exit_code == 0  # dead letters alone are not an error
    strict = runner.invoke(app, ["replay", str(tmp_path), "-q", "--strict"])
    assert strict.exit_code == 3 and "1 input records were dead-lettered" in strict.output
    audit = tmp_path / "audit.jsonl"
    audit.write_text('{"event": "recommended", "action": "drain_node", "target": "n1", "recorded_at": 1.0}\n')
    (entry,) = [
        json.loads(line) for line in runner.invoke(app, ["audit", "--log", str(audit), "--json"]).output.splitlines()
    ]
    assert (entry["event"], entry["target"]) == ("recommended", "n1")
