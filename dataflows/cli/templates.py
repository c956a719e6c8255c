"""``trainguard templates``: what the signature catalogue is missing, as log templates.

Reads the anomalies of a replay or run archive, takes the evidence lines of the
``crash/unclassified`` ones (fatal-looking lines no catalogue signature
explained), mines them into templates with :class:`detectors.templates.ErrorTemplates`
and ranks the templates by the anomalies they appear in: the catalogue's to-do list.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Annotated, Any

import polars as pl
import typer
from rich.table import Table
from rich.text import Text

from trainguard.cli.common import console, err_console
from trainguard.dataflows.archive import read_dataset
from trainguard.detectors.ids import quoted_line

# What ``detectors.templates.TemplateHit.evidence`` adds to an anomaly's evidence: not a log line.
TEMPLATE_EVIDENCE = "template: "


@dataclass(slots=True)
class TemplateRow:
    """One template: in how many unclassified anomalies and lines it appears, and where."""

    template_id: int
    template: str
    anomalies: int = 0
    lines: int = 0
    example: str = ""
    jobs: list[str] = field(default_factory=list)


def evidence_text(entry: str) -> str | None:
    """The log line of an evidence entry, ``None`` for an entry that is not a line (a note).

    >>> evidence_text("node-7/rank3: terminate called after throwing an instance of 'foo::Bar'")
    "terminate called after throwing an instance of 'foo::Bar'"
    >>> evidence_text("no catalogue signature explains these lines; the job stopped after them") is None
    True
    >>> evidence_text("template: terminate called after throwing an instance of <*> (new in this job)") is None
    True
    """
    if entry.startswith(TEMPLATE_EVIDENCE):
        return None
    return quoted_line(entry)


def mine_unclassified(anomalies: pl.DataFrame) -> list[TemplateRow]:
    """Templates of the evidence lines of the ``unclassified`` anomalies, most anomalies first.

    ``anomalies``: an archive's anomalies frame (:func:`dataflows.archive.read_dataset`).
    """
    from trainguard.detectors.templates import ErrorTemplates  # drain3 takes ~40 ms to import: only for this command

    miner = ErrorTemplates(max_clusters=None)
    per_line: list[tuple[int, str, str, str]] = []  # template id, anomaly id, job, line
    rows = anomalies.filter(pl.col("category") == "unclassified").select("anomaly_id", "job_id", "evidence")
    for anomaly_id, job_id, evidence in rows.iter_rows():
        for entry in evidence or []:
            line = evidence_text(entry)
            if line:
                per_line.append((miner.add(line).template_id, anomaly_id, job_id or "-", line))
    # Templates generalise as lines arrive: name each by its final text.
    final = {hit.template_id: hit.template for hit in miner.templates()}
    found: dict[int, TemplateRow] = {}
    seen: dict[int, tuple[set[str], set[str]]] = {}
    for tid, anomaly_id, job_id, line in per_line:
        row = found.get(tid)
        if row is None:
            row = found[tid] = TemplateRow(tid, final[tid], example=line)
            seen[tid] = (set(), set())
        ids, jobs = seen[tid]
        row.lines += 1
        ids.add(anomaly_id)
        jobs.add(job_id)
    for tid, row in found.items():
        ids, jobs = seen[tid]
        row.anomalies = len(ids)
        row.jobs = sorted(jobs)
    return sorted(found.values(), key=lambda r: (-r.anomalies, -r.lines, r.template_id))


# What a placeholder of ``detectors.templates.MASKS`` stands for: one word, or a date that may
# hold a space; ``<*>`` is a word drain3 saw vary.
_PLACEHOLDER = re.compile(r"<(\*|[A-Z]+)>")
_STANDS_FOR = {"DATE": r"\S+(?:[ T]\S+)?"}
MIN_LITERAL_CHARS = 8  # fewer and the pattern would match lines it has nothing to do with


def site_pattern(template: str) -> str | None:
    r"""The regular expression that reads the lines of ``template``, or ``None`` when it is too vague.

    Placeholders (``<NUM>``, ``<PATH>``, ``<*>`` …) become the words they stand for, runs of
    spaces any whitespace (the miner collapsed them).

    >>> site_pattern("fabricmanager: port <NUM> flapped (<*>)")
    'fabricmanager:\\s+port\\s+\\S+?\\s+flapped\\s+\\(\\S+?\\)'
    >>> site_pattern("<*> <NUM> <*>") is None
    True
    """
    template = template.split("…", 1)[0].strip()  # evidence is clipped: match what was kept
    pieces = _PLACEHOLDER.split(template)
    literals, names = pieces[0::2], pieces[1::2]
    if sum(len(x.replace(" ", "")) for x in literals) < MIN_LITERAL_CHARS:
        return None
    parts = [r"\s+".join(re.escape(word) for word in literals[0].split(" "))]
    for name, literal in zip(names, literals[1:], strict=True):
        parts.append(_STANDS_FOR.get(name, r"\S+?"))
        parts.append(r"\s+".join(re.escape(word) for word in literal.split(" ")))
    return "".join(parts)


def site_signature(row: TemplateRow, pattern: str) -> str:
    r"""``row`` as a site signature (``detectors.signatures`` in the config) reading ``pattern``; the
    layer is the operator's to decide.

    >>> print(site_signature(TemplateRow(7, "port <NUM> flapped"), r"port\s+\S+?\s+flapped"))
    - id: template-7
      pattern: "port\\s+\\S+?\\s+flapped"
      category: site_template_7
      layer: system  # decide: hardware | system | application
    """
    return "\n".join(
        [
            f"- id: template-{row.template_id}",
            f"  pattern: {json.dumps(pattern)}",  # a JSON string is a YAML double-quoted scalar
            f"  category: site_template_{row.template_id}",
            "  layer: system  # decide: hardware | system | application",
        ]
    )


def _signatures_yaml(rows: list[TemplateRow]) -> str:
    """The site signatures of ``rows`` as YAML; a template whose pattern would not read its own
    example line (or is too vague) is left out, with a comment that says so."""
    out = ["detectors:", "  signatures:"]
    for row in rows:
        pattern = site_pattern(row.template)
        if pattern is None or re.search(pattern, row.example) is None:
            out.append(f"    # template {row.template_id} left out: no pattern reads its lines ({row.template[:80]!r})")
            continue
        out.append(f"    # in {row.anomalies} unclassified anomalies, e.g. {json.dumps(row.example[:160])}")
        out += ["    " + line for line in site_signature(row, pattern).splitlines()]
    return "\n".join(out)


def _stop(message: str) -> typer.Exit:
    err_console.print(f"[bold red]error:[/] {message}", soft_wrap=True)
    return typer.Exit(1)


def _jobs_cell(jobs: list[str], limit: int = 4) -> str:
    shown = ", ".join(jobs[:limit])
    return shown + (f" +{len(jobs) - limit} more" if len(jobs) > limit else "")


def templates(
    archive: Annotated[Path, typer.Argument(help="Archive directory of a replay or run (its --out).")],
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object per template (JSON Lines).")] = False,
    top: Annotated[int, typer.Option(min=1, help="Show the N templates seen in most anomalies.")] = 20,
    signatures: Annotated[
        bool,
        typer.Option("--signatures", help="Print them as site signatures to paste into the config (not with --json)."),
    ] = False,
) -> None:
    """Mine the lines of unclassified crashes into templates: what the signature catalogue is missing."""
    if as_json and signatures:
        raise _stop("--json and --signatures print different things; give one of them.")
    if not (archive / "anomalies").is_dir():
        raise _stop(f"{archive} holds no anomalies/ folder; pass the --out directory of a replay or run.")
    try:
        frame = read_dataset(archive, "anomalies")
    except Exception as exc:  # a damaged file: polars, pyarrow and the OS raise many kinds
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise _stop(f"could not read the anomalies in {archive} ({reason}).") from None
    if frame.height == 0:
        raise _stop(f"{archive} holds no anomalies; run a replay with --out {archive} first.")
    found = mine_unclassified(frame)
    unclassified = frame.filter(pl.col("category") == "unclassified").height
    if not found:
        what = "none is unclassified" if unclassified == 0 else f"the {unclassified} unclassified carry no log lines"
        err_console.print(f"{frame.height} anomalies in {archive}, and {what}: nothing to mine.")
        return
    shown = found[:top]
    if signatures:
        typer.echo(_signatures_yaml(shown))
        return
    if as_json:
        for row in shown:
            record: dict[str, Any] = asdict(row)
            typer.echo(json.dumps(record, ensure_ascii=False))
        return
    lines = sum(r.lines for r in found)
    table = Table(
        title=f"Templates of unclassified crashes: {len(found)} from {lines} lines of {unclassified} anomalies"
        + (f" (top {top})" if len(found) > top else "")
    )
    table.add_column("#", justify="right")
    table.add_column("template", overflow="fold")
    table.add_column("anomalies", justify="right")
    table.add_column("lines", justify="right")
    table.add_column("example", overflow="fold")
    table.add_column("jobs", overflow="fold")
    for row in shown:
        # Text, not markup: log lines are full of [brackets].
        table.add_row(
            str(row.template_id),
            Text(row.template),
            str(row.anomalies),
            str(row.lines),
            Text(row.example),
            Text(_jobs_cell(row.jobs)),
        )
    console.print(table)


def register(app: typer.Typer) -> None:
    app.command()(templates)
