"""The systemd units pass ``systemd-analyze verify`` and run commands and options that exist."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.support.paths import ROOT
from trainguard.cli.app import app

UNITS = sorted((ROOT / "deploy" / "systemd").glob("*.service"))
ENV_FILE = ROOT / "deploy" / "systemd" / "trainguard.env"
INSTALLED = "/opt/trainguard/venv/bin/trainguard"  # where the units expect trainguard (docs/deploy-slurm.md)


def _exec_start(unit: Path) -> list[str]:
    (line,) = [x for x in unit.read_text().splitlines() if x.startswith("ExecStart=")]
    return shlex.split(line.removeprefix("ExecStart="))


def test_every_unit_passes_systemd_analyze_verify(tmp_path: Path):
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        if os.environ.get("TRAINGUARD_REQUIRE_SYSTEMD"):
            pytest.fail("systemd-analyze is required here (TRAINGUARD_REQUIRE_SYSTEMD) but missing")
        pytest.skip("needs systemd-analyze (Debian's systemd package)")
    trainguard = Path(sys.executable).with_name("trainguard")  # this checkout's install stands in for /opt/…
    for unit in UNITS:  # in place of /etc/trainguard/trainguard.env: the shipped example
        text = unit.read_text().replace(INSTALLED, str(trainguard))
        (tmp_path / unit.name).write_text(text.replace("/etc/trainguard/trainguard.env", str(ENV_FILE)))
    result = subprocess.run(
        [analyze, "verify", "--man=no", *sorted(str(p) for p in tmp_path.glob("*.service"))],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0 and not result.stdout.strip() and not result.stderr.strip(), result.stderr
    # …and it does catch a broken unit, so the check above means something.
    broken = tmp_path / "broken.service"
    broken.write_text(UNITS[0].read_text().replace(INSTALLED, "/nonexistent/trainguard"))
    assert subprocess.run([analyze, "verify", "--man=no", str(broken)], capture_output=True).returncode != 0


def test_every_agent_and_the_engine_have_a_unit_and_their_options_exist():
    commands = {}
    env_names = set(re.findall(r"^([A-Z_]+)=", ENV_FILE.read_text(), flags=re.M))
    for unit in UNITS:
        program, command, *rest = _exec_start(unit)
        assert program == INSTALLED
        commands[command] = unit.name
        assert "EnvironmentFile=/etc/trainguard/trainguard.env" in unit.read_text()
        shown = CliRunner().invoke(app, [command, "--help"], terminal_width=200).output
        for word in rest:
            if word.startswith("$"):
                assert word[1:] in env_names, f"{unit.name}: {word} is not in trainguard.env"
            elif word.startswith("--"):
                assert word.split("=")[0] in shown, f"{unit.name}: trainguard {command} has no {word}"
    assert set(commands) == {"run", "collect-gpu", "collect-stacks", "ship-logs", "watch-slurm"}
