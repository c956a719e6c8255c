"""Every command, given a user's mistakes: a non-zero exit and a short message, never a traceback.

Each row is a mistake seen or likely (a missing file, a path that cannot be written, a word
where a number goes, an unknown preset, a broker that is not there). Typer's own usage errors
(exit 2, "Usage: …") count as clear; an uncaught exception does not.
"""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from typer.testing import CliRunner

from trainguard.cli.app import app

runner = CliRunner()


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _mistakes(tmp: Path) -> list[list[str]]:
    missing = str(tmp / "missing")
    bad_yaml = tmp / "bad.yaml"
    bad_yaml.write_text("policy: [\n")
    typo = tmp / "typo.yaml"
    typo.write_text("policy:\n  mode: enforcing\n")
    a_file = tmp / "a.log"
    a_file.write_text("step 1\n")
    nowhere = f"127.0.0.1:{_closed_port()}"
    no_slurm = tmp / "no-slurm.yaml"
    no_slurm.write_text(f"scheduler:\n  bin_dir: {tmp / 'empty'}\n  attempts: 1\n")
    with_audit = tmp / "audit.yaml"
    with_audit.write_text(f"audit_log: {tmp / 'audit.jsonl'}\n")
    unwritable = "/proc/trainguard-cannot-write-here"
    return [
        ["replay", missing],
        ["replay", str(a_file)],
        ["replay", missing, "--speed", "fast"],
        ["demo", "--out", unwritable],
        ["run", "-c", missing],
        ["run", "-c", str(bad_yaml)],
        ["run", "-c", str(typo)],
        ["run", "--brokers", nowhere],
        ["produce", missing, "--brokers", nowhere],
        ["collect-gpu", "--out", str(tmp / "gpu.jsonl")],
        ["collect-stacks", "--once", "--out", str(tmp / "stacks.jsonl")],  # which job?
        ["collect-stacks", "--job", "7", "--once", "--py-spy", missing],
        ["collect-stacks", "--out", str(tmp / "stacks.jsonl")],  # requests come from Kafka
        ["collect-stacks", "--brokers", nowhere],
        ["console", "--archive", missing],
        ["watch-slurm", "--brokers", nowhere],
        ["watch-slurm", "--out", str(tmp / "w.jsonl"), "-c", str(no_slurm)],
        ["ship-logs", missing, "--brokers", nowhere],
        ["import-logs", missing, "--out", str(tmp / "o")],
        ["import-logs", str(a_file), "--out", str(tmp / "o")],
        ["import-logs", str(a_file), "--out", unwritable, "--start", "0"],
        ["import-logs", str(a_file), "--out", str(tmp / "o"), "--start", "yesterday"],
        ["import-prometheus", "http://127.0.0.1:9", "--out", str(tmp / "p"), "--start", "yesterday"],
        ["import-prometheus", "http://127.0.0.1:9", "--out", str(tmp / "p"), "--start", "0", "--step", "often"],
        ["import-prometheus", "not a url", "--out", str(tmp / "p"), "--start", "0"],
        ["watch-kubernetes", "--out", str(tmp / "k.jsonl"), "--interval", "0"],
        ["split-replay", missing, "--out", str(tmp / "s"), "--shards", "2"],
        ["split-replay", str(tmp), "--out", unwritable, "--shards", "2"],
        ["split-replay", str(tmp), "--out", str(tmp / "s"), "--shards", "0"],
        ["evaluate", "--preset", "nope", "--seeds", "1"],
        ["evaluate", "--seeds", "one"],
        ["generate", "--preset", "nope", "--out", str(tmp / "g")],
        ["generate", "--seed", "seven", "--out", str(tmp / "g")],
        ["score", "--labels", missing, "--anomalies", missing],
        ["tune", "--preset", "nope", "--param", "detectors.hang.floor_s=45"],
        ["tune", "--param", "detectors.hang.nope=1", "--seeds", "1"],
        ["tune", "--param", "detectors.hang.floor_s=45", "--processes", "0"],
        ["evaluate", "--seeds", "1", "--processes", "many"],
        ["audit", "--log", missing],
        ["templates", missing],
        ["hash-password"],
        ["explain", "an-0", "--archive", missing],
        ["silence", "add", "--node", "n1", "--for", "4h", "--reason", "RMA"],  # no silences file configured
        ["silence", "add", "--node", "n1", "--for", "soon", "--reason", "RMA", "-c", str(with_audit)],
        ["silence", "expire", "si-nope", "-c", str(with_audit)],
        ["config", "show", "-c", missing],
        ["config", "show", "-c", str(typo)],
        ["config", "init", unwritable + "/tg.yaml"],
        ["bench", "replay", "--run", "x2"],
        ["bench", "replay", "--preset", "nope"],
        ["bench", "replay", "--mix", "video"],
        ["bench", "corpus", missing],
        ["bench", "nab", "--nab", missing],
        ["bench", "nab", "--detector", "nope", "--nab", str(tmp)],
        ["bench", "soak", "--hours", "0"],
        ["bench", "corpus", str(a_file)],  # not JSON Lines of excerpts
        ["generate", "--preset", "demo", "--nodes", "40", "--out", str(tmp / "g")],
    ]


def test_every_command_answers_mistakes_without_a_traceback(tmp_path: Path) -> None:
    mistakes = _mistakes(tmp_path)
    commands = {c.name or (c.callback.__name__ if c.callback else "") for c in app.registered_commands}
    assert {m[0] for m in mistakes} >= commands - {"hash-password"}, "a command without a mistake to try"
    for args in mistakes:
        result = runner.invoke(app, args, input="short\n")
        assert isinstance(result.exception, SystemExit), f"{args}: {result.exception!r}\n{result.output}"
        assert result.exit_code != 0, f"{args} accepted a mistake:\n{result.output}"
        assert "Traceback" not in result.output, f"{args}:\n{result.output}"
        lines = [line for line in result.output.splitlines() if line.strip()]
        if not lines[0].startswith("Usage:"):  # ours: one sentence on one line
            assert len(lines) == 1 and lines[0].startswith("error: "), f"{args}:\n{result.output}"


@pytest.mark.parametrize("flag", ["--version"])
def test_version(flag: str) -> None:
    result = runner.invoke(app, [flag])
    assert result.exit_code == 0 and result.output.startswith("trainguard ")
