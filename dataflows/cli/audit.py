"""``trainguard audit``: what trainguard recommended and did, filtered by job, node and time."""

from __future__ import annotations

import json
import re
import time
from datetime import datetime
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from trainguard.actions.audit import compact, query
from trainguard.cli.common import ConfigOpt, console, fail, settings_from

_AGO = re.compile(r"^(\d+(?:\.\d+)?)([smhd])$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_since(text: str, now: float | None = None) -> float:
    """Epoch seconds from ``90m``/``2h``/``1d`` (ago) or an ISO 8601 time.

    >>> parse_since("2h", now=10_000.0)
    2800.0
    >>> parse_since("2026-12-02T10:00:00Z")
    1796205600.0
    """
    m = _AGO.match(text.strip())
    if m:
        return (now if now is not None else time.time()) - float(m[1]) * _UNIT_S[m[2]]
    try:
        return datetime.fromisoformat(text.strip().replace("Z", "+00:00")).timestamp()
    except ValueError:
        raise ValueError(f"--since {text!r} is neither a duration like 2h or 30m nor an ISO time") from None


def register(app: typer.Typer) -> None:
    @app.command()
    def audit(
        job: Annotated[str | None, typer.Option(help="Only entries about this job.")] = None,
        node: Annotated[str | None, typer.Option(help="Only entries targeting or naming this node.")] = None,
        since: Annotated[str | None, typer.Option(help="Only entries since 2h / 30m / an ISO time.")] = None,
        log: Annotated[Path | None, typer.Option(help="Audit log (default: audit_log from the config).")] = None,
        parquet: Annotated[Path | None, typer.Option(help="Also write the whole log to this Parquet file.")] = None,
        as_json: Annotated[bool, typer.Option("--json", help="JSON Lines: the matching entries as written.")] = False,
        config: ConfigOpt = None,
    ) -> None:
        """Show the audit trail: recommendations, intents, outcomes, breaker changes."""
        path = log or (Path(p) if (p := settings_from(config).audit_log) else None)
        if path is None:
            raise fail("no audit log given; pass --log PATH or set audit_log in the config.")
        if not path.is_file():
            raise fail(f"audit log {path} does not exist; check --log or audit_log in the config.")
        try:
            cutoff = parse_since(since) if since else None
        except ValueError as exc:
            raise fail(str(exc)) from None
        frame = query(path, job=job, node=node, since=cutoff)
        if as_json:
            for row in frame.drop("recorded", strict=False).iter_rows(named=True):
                typer.echo(json.dumps(row, default=str))
            return
        table = Table(title=f"Audit trail ({frame.height} entries)")
        for column in ("time", "event", "action", "target", "mode", "job", "category", "reason"):
            table.add_column(column, overflow="fold")
        for row in frame.iter_rows(named=True):
            when = row["recorded"].strftime("%Y-%m-%d %H:%M:%S") if row["recorded"] else "-"
            table.add_row(
                when,
                row["event"] or "-",
                row["action"] or "-",
                row["target"] or "-",
                row["mode"] or "-",
                row["job_id"] or "-",
                row["category"] or "-",
                (row["reason"] or "")[:90],
            )
        console.print(table)
        if parquet is not None:
            count = compact(path, parquet)
            console.print(f"wrote {count} entries to {parquet}")
