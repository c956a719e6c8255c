"""``trainguard silence add | list | expire``: maintenance windows and known problems.

The flow, the console and these commands share one silences file (``silences:`` in the
config, else ``silences.jsonl`` beside the audit log); every change is audited.
"""

from __future__ import annotations

import getpass
import json
import time
from datetime import UTC, datetime
from typing import Annotated

import msgspec
import typer
from rich.table import Table

from trainguard.actions.audit import AuditLog
from trainguard.actions.silences import SilenceError, Silences, parse_duration
from trainguard.cli.common import ConfigOpt, console, fail, settings_from

silence_app = typer.Typer(no_args_is_help=True, help="Silence anomalies by node, job, kind or partition for a while.")


def _store(config: ConfigOpt) -> Silences:
    settings = settings_from(config)
    path = settings.silences_path
    if path is None:
        raise fail("no silences file: set audit_log (silences.jsonl goes beside it) or silences in the config (-c).")
    return Silences(path, AuditLog(settings.audit_log) if settings.audit_log else None)


def _user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "cli"


def _when(ts: float | None) -> str:
    return "-" if ts is None else datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M UTC")


def add(
    duration: Annotated[str, typer.Option("--for", help="How long: 30m, 4h, 2d.")],
    reason: Annotated[str, typer.Option(help="Why (shown wherever the silence suppresses something).")],
    node: Annotated[str | None, typer.Option(help="Node name.")] = None,
    job: Annotated[str | None, typer.Option(help="Job id, or a glob such as 'llm-*'.")] = None,
    kind: Annotated[str | None, typer.Option(help="Anomaly kind: crash, hang, straggler, …")] = None,
    partition: Annotated[str | None, typer.Option(help="Partition (needs the scheduler's inventory).")] = None,
    config: ConfigOpt = None,
) -> None:
    """Silence matching anomalies: still archived, never notified or acted on, until the silence ends."""
    store = _store(config)
    try:
        silence = store.add(
            duration_s=parse_duration(duration),
            reason=reason,
            by=_user(),
            node=node,
            job=job,
            kind=kind,
            partition=partition,
        )
    except SilenceError as exc:
        raise fail(str(exc)) from None
    console.print(f"added {silence.describe()}, until {_when(silence.ends_at)}", soft_wrap=True)


def list_silences(
    show_all: Annotated[bool, typer.Option("--all", help="Include silences that have ended.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="JSON Lines, one silence per line.")] = False,
    config: ConfigOpt = None,
) -> None:
    """The silences in force (or all of them)."""
    now = time.time()
    silences = [s for s in _store(config).all() if show_all or s.active(now)]
    if as_json:
        for s in silences:
            typer.echo(json.dumps({**msgspec.structs.asdict(s), "active": s.active(now)}))
        return
    table = Table("id", "node", "job", "kind", "partition", "until", "by", "reason", box=None)
    for s in silences:
        until = _when(s.ends_at if s.expired_at is None else min(s.ends_at, s.expired_at))
        table.add_row(
            s.silence_id, s.node or "", s.job or "", s.kind or "", s.partition or "", until, s.created_by, s.reason
        )
    console.print(table if silences else "no silences in force")


def expire(
    silence_id: Annotated[str, typer.Argument(help="The silence's id (from `trainguard silence list`).")],
    config: ConfigOpt = None,
) -> None:
    """End a silence now."""
    try:
        silence = _store(config).expire(silence_id, by=_user())
    except SilenceError as exc:
        raise fail(str(exc)) from None
    console.print(f"expired {silence.describe()}", soft_wrap=True)


def register(app: typer.Typer) -> None:
    silence_app.command()(add)
    silence_app.command("list")(list_silences)
    silence_app.command()(expire)
    app.add_typer(silence_app, name="silence")
