"""``trainguard explain ANOMALY_ID``: one anomaly, as an on-call engineer needs it.

What happened and where, the evidence, the signature or rule that fired (with its
thresholds), NVIDIA's description and resolution for an Xid, the decisions taken with their
reasons (mode, breaker, budget, cooldown) and what to do next (the remedy and the runbook).
Reads a replay's or run's archive (``--archive OUT``) and, when given, the audit log.
"""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import msgspec
import typer

from trainguard.actions.audit import read_entries
from trainguard.cli.common import ConfigOpt, console, fail, settings_from
from trainguard.cli.templates import TEMPLATE_EVIDENCE
from trainguard.dataflows.archive import anomaly_from_row, epoch_times, read_dataset
from trainguard.detectors.describe import summary
from trainguard.detectors.events import Anomaly
from trainguard.detectors.ids import quoted_line
from trainguard.detectors.job_states import FAILED as FAILED_STATES
from trainguard.detectors.signatures import CATALOGUE, match_line, use_site_signatures
from trainguard.detectors.stacks import group_lines
from trainguard.detectors.xid import xid_info

_XID = re.compile(r"^xid_(\d+)$")
RUNBOOKS = "docs/runbooks.md"


def explanation(anomaly: Anomaly, actions: list[dict[str, Any]], audit: list[dict[str, Any]], config: Any) -> dict:
    """Everything ``explain`` prints, as data (``--json`` prints this)."""
    out: dict[str, Any] = {
        "anomaly_id": anomaly.anomaly_id,
        "summary": anomaly.summary or summary(anomaly),
        "runbook_url": anomaly.runbook_url,
        "detected_at": _iso(anomaly.detected_at),
        "status": f"resolved at {_iso(anomaly.resolved_at)}: {anomaly.resolution}" if anomaly.resolved_at else "open",
        "where": {"job": anomaly.job_id, "nodes": anomaly.nodes, "gpus": anomaly.gpus, "ranks": anomaly.ranks},
        "layer": anomaly.layer,
        "transient": anomaly.transient,
        "severity": anomaly.severity,
        "evidence": anomaly.evidence,
        "localisation": anomaly.localisation,
        "stack_groups": [msgspec.to_builtins(g) for g in anomaly.stack_groups],
        "rule": _rule(anomaly, config),
        "decisions": [{k: a.get(k) for k in ("action", "target", "mode", "status", "reason")} for a in actions],
        "audit": [{k: e.get(k) for k in ("event", "action", "target", "recorded_at", "user")} for e in audit],
        "next": _next_steps(anomaly, actions),
    }
    code = _XID.match(anomaly.category)
    if code:
        info = xid_info(int(code[1]))
        out["xid"] = {
            "code": info.code,
            "description": info.description,
            "immediate_resolution": info.immediate,
            "investigatory_resolution": info.investigatory,
        }
    return out


# What the catalogue and the scheduler's job states raise from log lines; a category read from log
# lines that is none of these came from a site signature (or a detector plugin).
_KNOWN_CATEGORIES = frozenset(
    {s.category for s in CATALOGUE} | {category for category, _ in FAILED_STATES.values()} | {"unclassified"}
)


def _rule(anomaly: Anomaly, config: Any) -> str:
    if anomaly.kind == "hang":
        h = config.detectors.hang
        return (
            f"hang rule: no progress past max({h.floor_s:g} s, {h.factor:g} x the step interval); "
            f"{h.pause_grace_s:g} s where the job's rhythm predicts a pause; GPUs spinning in NCCL confirm "
            f"after {h.confirm_s:g} s; GPUs still computing wait up to {h.busy_grace_s:g} s"
        )
    if anomaly.kind in ("straggler", "imbalance"):
        s = config.detectors.straggler
        return (
            f"straggler rule: step time above {s.ratio:g} x the job's median for {s.consecutive} steps, "
            f"or a rank score below {s.rank_threshold:g} for {s.rank_consecutive} windows"
        )
    lines = [
        (entry, quoted)
        for entry in anomaly.evidence
        if not entry.startswith((TEMPLATE_EVIDENCE, "scheduler: ")) and (quoted := quoted_line(entry))
    ]
    matched = [(m.signature, entry) for entry, quoted in lines if (m := match_line(quoted)) is not None]
    if matched:
        # An incident's evidence holds its consequences too: the line that reads as its category raised it.
        sig, entry = min(matched, key=lambda m: m[0].category != anomaly.category)
        return f"signature {sig.id} ({sig.category}, {sig.layer}): /{sig.pattern}/ matched {entry!r}"
    if anomaly.category == "unclassified":
        return "no signature: fatal-looking lines followed by the job stopping (crash/unclassified)"
    if lines and anomaly.category not in _KNOWN_CATEGORIES and not anomaly.category.startswith("xid"):
        return (
            f"{anomaly.kind}/{anomaly.category}: no signature of this config reads its lines; a site signature "
            "of the run's config, or a detector plugin, raised it (pass --config the run's config)"
        )
    return f"{anomaly.kind}/{anomaly.category} (a detector rule; see docs/detectors.md)"


def _next_steps(anomaly: Anomaly, actions: list[dict[str, Any]]) -> list[str]:
    steps = []
    if anomaly.remedy:
        steps.append(f"remedy (NVIDIA): {anomaly.remedy}")
    pending = [a for a in actions if a.get("status") == "recommended"]
    for a in pending:
        steps.append(f"recommended, not done: {a['action']} {a['target']} (approve in the console, or enforce)")
    steps.append(f"runbook: {anomaly.runbook_url or f'{RUNBOOKS}#{anomaly.kind}'}")
    return steps


def _iso(ts: float | None) -> str:
    return "-" if ts is None else datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def explain(
    anomaly_id: Annotated[str, typer.Argument(help="The anomaly's id (as printed by replay, the console, alerts).")],
    archive: Annotated[Path, typer.Option(help="The archive of the run (a replay's or run's --out).")] = Path(
        "trainguard-out/demo"
    ),
    audit_log: Annotated[Path | None, typer.Option("--audit", help="The audit log (default: the archive's).")] = None,
    config: ConfigOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the explanation as JSON.")] = False,
) -> None:
    """Explain one anomaly: evidence, the rule that fired, NVIDIA's word on an Xid, the decisions, what next."""
    settings = settings_from(config)
    use_site_signatures(settings.detectors.signatures)  # the rule that fired may be one of this site's
    if not (archive / "anomalies").is_dir():
        raise fail(f"{archive} holds no anomalies/ folder; pass --archive the --out directory of a replay or run.")
    rows = read_dataset(archive, "anomalies").filter(anomaly_id=anomaly_id).to_dicts()
    if not rows:
        raise fail(f"no anomaly {anomaly_id!r} in {archive}; the ids are in the replay summary and the console.")
    anomaly = anomaly_from_row(rows[0])
    # An action is archived again when its status changes (approved, applied): keep its latest record.
    latest = {
        a["action_id"]: epoch_times(a)
        for a in read_dataset(archive, "actions").filter(anomaly_id=anomaly_id).to_dicts()
    }
    actions = list(latest.values())
    audit_path = audit_log or archive / "audit.jsonl"
    audit = [e for e in read_entries(audit_path) if e.get("anomaly_id") == anomaly_id]
    report = explanation(anomaly, actions, audit, settings)
    if as_json:
        typer.echo(json.dumps(report, default=str))
        return
    console.print(f"[bold]{report['summary']}[/]  ({anomaly_id})")
    console.print(f"detected {report['detected_at']}; {report['status']}; severity {anomaly.severity}")
    w = report["where"]
    console.print(f"job {w['job'] or '-'}; nodes {', '.join(w['nodes']) or '-'}; gpus {', '.join(w['gpus']) or '-'}")
    if w["ranks"]:
        named = f"ranks named by {anomaly.localisation}" if anomaly.localisation else "ranks that reported"
        console.print(f"{named}: {', '.join(map(str, w['ranks']))}")
    console.print("[bold]evidence[/]")
    for line in anomaly.evidence:
        console.print(f"  {line}", markup=False, highlight=False)
    if anomaly.stack_groups:
        by = f" (the culprit named by {anomaly.localisation})" if anomaly.localisation else ""
        console.print(f"[bold]stacks[/]{by}")
        for line in group_lines(anomaly.stack_groups):
            console.print(f"  {line}", markup=False, highlight=False)
    console.print("[bold]why[/]")
    console.print(f"  {report['rule']}", markup=False)
    if "xid" in report:
        x = report["xid"]
        console.print(f"  Xid {x['code']}: {x['description']}", markup=False)
        console.print(f"  NVIDIA: {x['immediate_resolution']} (then {x['investigatory_resolution']})", markup=False)
    console.print("[bold]decisions[/]")
    for d in report["decisions"] or [{"action": "none", "target": "", "mode": "", "status": "", "reason": ""}]:
        console.print(f"  {d['action']} {d['target']}: {d['status']} ({d['mode']}) {d['reason']}", markup=False)
    console.print("[bold]next[/]")
    for step in report["next"]:
        console.print(f"  {step}", markup=False)


def register(app: typer.Typer) -> None:
    app.command()(explain)
