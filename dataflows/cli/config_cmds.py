"""``trainguard config show`` and ``trainguard config init``: the effective settings, and a starter file.

``show`` prints every setting with its value and where the value came from: the config
file, an environment variable, or the default. ``init`` writes a commented starter file
that loads to exactly the defaults (monitor mode, no scheduler), for an operator to edit.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated, Any

import msgspec
import typer
import yaml
from rich.table import Table

from trainguard.cli.common import ConfigOpt, console, fail, settings_from

config_app = typer.Typer(no_args_is_help=True, help="Show the effective settings, or write a starter config file.")

# Environment variables the commands read, and the setting each one sets.
ENVIRONMENT = {"TRAINGUARD_BROKERS": "kafka.brokers", "TRAINGUARD_OUT": "archive.path"}

STARTER = """\
# trainguard configuration. Every key is optional: what is left out keeps its default
# (`trainguard config show -c THIS_FILE` lists them all, with where each value came from).

policy:
  # monitor: recommend only (the default). enforce: act on the scheduler. A scope's mode
  # wins for the partitions or job names it covers (first match), e.g. a canary partition:
  mode: monitor
  scopes: []
  #  - {partition: canary, mode: enforce}
  #  - {job: "llm-*", mode: monitor}

scheduler:
  # none | dry-run | slurm | kubernetes. Monitor mode needs no scheduler at all.
  driver: none
  # ssh_host: slurm-head      # run squeue/sinfo/scontrol there (ssh -o BatchMode=yes)

kafka:
  brokers: []                 # or --brokers / TRAINGUARD_BROKERS
  starting_offset: beginning

archive:
  path: null                  # Parquet archive of anomalies and actions (or --out)

detectors:
  hang:
    floor_s: 55.0             # no hang is declared before this many seconds without progress
    pause_grace_s: 900.0      # a stall where the job's rhythm predicts an evaluation or checkpoint
  straggler:
    ratio: 1.25               # sustained step time above 1.25 x the job's own median

# audit_log: /var/lib/trainguard/audit.jsonl
"""


def show(
    config: ConfigOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="JSON Lines: one object per setting.")] = False,
) -> None:
    """Print every setting: its effective value and where it came from (file, environment, default)."""
    settings = settings_from(config)
    from_file = _flatten(yaml.safe_load(config.read_text(encoding="utf-8")) or {}) if config is not None else {}
    rows = []
    for key, value in _flatten(msgspec.to_builtins(settings)).items():
        source = "default"
        if key in from_file:
            source = f"file {config}"
        for variable, setting in ENVIRONMENT.items():
            if setting == key and os.environ.get(variable):
                source, value = f"environment {variable}", os.environ[variable]
        rows.append({"setting": key, "value": value, "source": source})
    if as_json:
        for row in rows:
            typer.echo(json.dumps(row, default=str))
        return
    table = Table("setting", "value", "from", box=None)
    for row in rows:
        table.add_row(row["setting"], json.dumps(row["value"], default=str), row["source"])
    console.print(table)


def init(
    path: Annotated[Path, typer.Argument(help="Where to write the starter file.")] = Path("trainguard.yaml"),
    force: Annotated[bool, typer.Option("--force", help="Overwrite an existing file.")] = False,
) -> None:
    """Write a commented starter config file (monitor mode, no scheduler)."""
    if path.exists() and not force:
        raise fail(f"{path} exists; pass --force to overwrite it, or another path.")
    try:
        path.write_text(STARTER, encoding="utf-8")
    except OSError as exc:
        raise fail(f"cannot write {path} ({exc.strerror or exc}).") from None
    console.print(f"wrote {path}; check it with: trainguard config show -c {path}")


def _flatten(data: Any, prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` → ``{"a.b": 1}``; lists and empty mappings stay values."""
    if not isinstance(data, dict) or (not data and prefix):
        return {prefix: data}
    out: dict[str, Any] = {}
    for key, value in data.items():
        out.update(_flatten(value, f"{prefix}.{key}" if prefix else str(key)))
    return out


def register(app: typer.Typer) -> None:
    config_app.command()(show)
    config_app.command()(init)
    app.add_typer(config_app, name="config")
