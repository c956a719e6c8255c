"""Score a replay's anomalies (and actions) against a scenario's labels.

Matching: an anomaly *explains* a labelled fault when it names the fault's job (or,
for a fault with no job, one of its nodes) and was detected between one minute
before the fault's onset and ``window_s`` after it. Every anomaly that explains no
fault is a false positive — including those raised on benign confounders.

- **recall** per fault kind: faults explained by an anomaly of a compatible kind;
- **precision** per anomaly kind: anomalies that explain some fault;
- **latency**: onset → the first compatible anomaly's ``detected_at`` (event time);
- **localisation**: the anomaly names one of the fault's nodes (rank, GPU when labelled);
- **layer**: the anomaly's layer equals the label's;
- **actions**: a drain is *wrongful* when its node is in no hardware fault's nodes or it
  answers an application fault; a hardware fault with nodes and no drain is *missing*;
- **benign alarms**: anomalies raised on a benign confounder's job within its window
  (a checkpoint, an evaluation pause); **false alarms resolved**: hang alarms that
  the job's own progress later resolved (measurable in production too, where there
  are no labels: see the ``trainguard_false_alarms_total`` metric).

Anomalies are read one record per id (a resolution is the same anomaly published again).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import msgspec
import polars as pl

from trainguard.detectors.lifecycle import is_false_alarm, latest_records

# Which anomaly kinds can explain which fault kinds.
COMPATIBLE: dict[str, set[str]] = {
    "crash": {"crash"},
    "hang": {"hang", "crash"},  # a hang is also fine to catch by its watchdog cascade
    "straggler": {"straggler", "gpu_degraded"},
    "numerics": {"numerics"},
    "node_unhealthy": {"node_unhealthy", "gpu_degraded"},
    "gpu_degraded": {"gpu_degraded", "node_unhealthy"},
}
WINDOW_S: dict[str, float] = {"crash": 900.0, "hang": 1800.0, "straggler": 1800.0, "numerics": 900.0}
DEFAULT_WINDOW_S = 1800.0
BENIGN_WINDOW_S = 600.0  # a benign pause lasts at most this long (checkpoint 1–4 min, evaluation 0.5–3 min)


def _ts(value: Any) -> float:
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, datetime):
        return value.timestamp()
    return datetime.fromisoformat(str(value)).timestamp()


def load_labels(path: Path) -> list[dict[str, Any]]:
    """The labelled faults of a scenario; ``ValueError`` with one sentence for a malformed file."""
    labels = []
    for number, line in enumerate(path.read_bytes().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            label = msgspec.json.decode(line)
            label["onset"] = _ts(label["onset_ts"])
            for key in ("kind", "layer", "job_id", "nodes"):
                label[key]
        except (msgspec.DecodeError, KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"labels file {path} line {number} is not a label ({exc}).") from None
        labels.append(label)
    return labels


def load_archive(path: Path) -> list[dict[str, Any]]:
    """Rows of an archive dataset (a directory of Parquet files), times as epoch seconds."""
    files = sorted(path.rglob("*.parquet"))
    if not files:
        return []
    rows = pl.concat([pl.read_parquet(f) for f in files], how="diagonal_relaxed").to_dicts()
    if rows and "anomaly_id" in rows[0] and "action_id" not in rows[0]:
        rows = latest_records(rows)  # a resolution is the same anomaly published again
    for row in rows:
        for key in ("detected_at", "onset_ts", "decided_at", "applied_at", "resolved_at"):
            if row.get(key) is not None:
                row[key] = _ts(row[key])
    return rows


def _quantile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


@dataclass
class KindScore:
    labelled: int = 0
    detected: int = 0
    anomalies: int = 0
    explained: int = 0
    latencies: list[float] = field(default_factory=list)
    localised: int = 0
    localisable: int = 0
    layer_right: int = 0

    def summary(self) -> dict[str, Any]:
        precision = self.explained / self.anomalies if self.anomalies else None
        recall = self.detected / self.labelled if self.labelled else None
        f1 = (2 * precision * recall / (precision + recall)) if precision and recall else None
        return {
            "labelled": self.labelled,
            "detected": self.detected,
            "anomalies": self.anomalies,
            "precision": precision,
            "recall": recall,
            "f1": f1,
            "latency_p50_s": _quantile(self.latencies, 0.5),
            "latency_p90_s": _quantile(self.latencies, 0.9),
            "latency_p99_s": _quantile(self.latencies, 0.99),
            "localisation": self.localised / self.localisable if self.localisable else None,
            "layer_accuracy": self.layer_right / self.detected if self.detected else None,
        }


def _explains(anomaly: dict[str, Any], label: dict[str, Any]) -> bool:
    if label["job_id"] is not None:
        place = anomaly.get("job_id") == label["job_id"] or (
            anomaly.get("job_id") is None and bool(set(anomaly.get("nodes") or []) & set(label["nodes"]))
        )
    else:
        place = bool(set(anomaly.get("nodes") or []) & set(label["nodes"]))
    window = WINDOW_S.get(label["kind"], DEFAULT_WINDOW_S)
    return place and label["onset"] - 60.0 <= anomaly["detected_at"] <= label["onset"] + window


def _matches(label: dict[str, Any], anomalies: list[dict[str, Any]]) -> tuple[list[dict], list[dict]]:
    """The anomalies that explain a labelled fault, and those of a compatible kind (earliest first)."""
    matches = [a for a in anomalies if _explains(a, label)]
    compatible = sorted(
        (a for a in matches if a["kind"] in COMPATIBLE.get(label["kind"], {label["kind"]})),
        key=lambda a: a["detected_at"],
    )
    return matches, compatible


def fault_table(labels: list[dict[str, Any]], anomalies: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per labelled fault: was it found, by which anomaly, how late, blaming which layer.

    The rows notebooks and dashboards start from (``polars.DataFrame(fault_table(...))``).
    """
    rows = []
    for label in labels:
        if label["kind"] == "benign":
            continue
        _, compatible = _matches(label, anomalies)
        first = compatible[0] if compatible else None
        rows.append(
            {
                "fault_id": label["fault_id"],
                "kind": label["kind"],
                "category": label["category"],
                "layer": label["layer"],
                "job_id": label["job_id"],
                "nodes": len(label["nodes"]),
                "onset": label["onset"],
                "detected": first is not None,
                "anomaly_id": first["anomaly_id"] if first else None,
                "detected_at": first["detected_at"] if first else None,
                "latency_s": max(0.0, first["detected_at"] - label["onset"]) if first else None,
                "blamed_layer": first.get("layer") if first else None,
            }
        )
    return rows


class Scorer:
    """Accumulates faults and anomalies over one or many scenarios, then reports."""

    def __init__(self) -> None:
        self.by_kind: dict[str, KindScore] = defaultdict(KindScore)
        self.faults = 0
        self.anomalies = 0
        self.false_positives: list[dict[str, Any]] = []
        self.missed: list[dict[str, Any]] = []
        self.actions: dict[str, Any] | None = None
        self.benign_alarms: list[dict[str, Any]] = []
        self.false_alarms_resolved = 0

    def add(
        self, labels: list[dict[str, Any]], anomalies: list[dict[str, Any]], actions: list[dict[str, Any]] | None = None
    ) -> Scorer:
        anomalies = latest_records(anomalies)
        faults = [lab for lab in labels if lab["kind"] != "benign"]
        explained_ids: set[str] = set()
        self.false_alarms_resolved += sum(is_false_alarm(a.get("kind"), a.get("resolution")) for a in anomalies)
        for label in faults:
            ks = self.by_kind[label["kind"]]
            ks.labelled += 1
            matches, compatible = _matches(label, anomalies)
            explained_ids.update(a["anomaly_id"] for a in matches)
            if not compatible:
                self.missed.append({k: label[k] for k in ("fault_id", "kind", "category", "job_id", "nodes")})
                continue
            first = compatible[0]
            ks.detected += 1
            ks.latencies.append(max(0.0, first["detected_at"] - label["onset"]))
            ks.layer_right += first.get("layer") == label["layer"]
            if label["nodes"]:
                ks.localisable += 1
                ks.localised += any(set(a.get("nodes") or []) & set(label["nodes"]) for a in compatible)
        for label in (lab for lab in labels if lab["kind"] == "benign"):
            self.benign_alarms += [
                {"benign": label["fault_id"], "anomaly_id": a["anomaly_id"], "kind": a["kind"], "job_id": a["job_id"]}
                for a in anomalies
                if a["anomaly_id"] not in explained_ids
                and (a.get("job_id") == label["job_id"] if label["job_id"] else set(a["nodes"]) & set(label["nodes"]))
                and label["onset"] - 60.0 <= a["detected_at"] <= label["onset"] + BENIGN_WINDOW_S
                and a.get("severity", "critical") == "critical"
            ]
        for anomaly in anomalies:
            ks = self.by_kind[anomaly["kind"]]
            ks.anomalies += 1
            ks.explained += anomaly["anomaly_id"] in explained_ids
            if anomaly["anomaly_id"] not in explained_ids:
                self.false_positives.append(
                    {k: anomaly.get(k) for k in ("anomaly_id", "kind", "category", "job_id", "nodes", "detected_at")}
                )
        self.faults += len(faults)
        self.anomalies += len(anomalies)
        if actions is not None:
            scored = score_actions(labels, anomalies, actions)
            if self.actions is None:
                self.actions = scored
            else:
                for key, value in scored.items():
                    self.actions[key] += value
        return self

    def report(self) -> dict[str, Any]:
        report: dict[str, Any] = {
            "faults": self.faults,
            "anomalies": self.anomalies,
            "false_positives": self.false_positives,
            "missed": self.missed,
            "benign_alarms": self.benign_alarms,
            "false_alarms_resolved": self.false_alarms_resolved,
            "by_kind": {kind: ks.summary() for kind, ks in sorted(self.by_kind.items())},
        }
        if self.actions is not None:
            report["actions"] = self.actions
        return report


def score(
    labels: list[dict[str, Any]], anomalies: list[dict[str, Any]], actions: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    """The report for one scenario (see :class:`Scorer`)."""
    return Scorer().add(labels, anomalies, actions).report()


def _needs_drain(label: dict[str, Any]) -> bool:
    return bool(label.get("drain", label["layer"] == "hardware"))


def score_actions(
    labels: list[dict[str, Any]], anomalies: list[dict[str, Any]], actions: list[dict[str, Any]]
) -> dict[str, Any]:
    anomalies = latest_records(anomalies)
    faults = [lab for lab in labels if lab["kind"] != "benign"]
    # Labels say whether the right answer takes the node out ("drain"); older labels: hardware faults do.
    drain_nodes = {n for lab in faults if _needs_drain(lab) for n in lab["nodes"]}
    by_id = {a["anomaly_id"]: a for a in anomalies}
    # A suppressed drain (cooldown, retry budget) drains nothing; a recommended one would have.
    drains = [x for x in actions if x["action"] == "drain_node" and x.get("status") != "suppressed"]
    wrongful = []
    for drain in drains:
        anomaly = by_id.get(drain["anomaly_id"], {})
        application = (
            any(lab["layer"] == "application" and _explains(anomaly, lab) for lab in faults) if anomaly else False
        )
        if drain["target"] not in drain_nodes or application:
            wrongful.append(
                {
                    "target": drain["target"],
                    "anomaly_id": drain["anomaly_id"],
                    "why": "application fault" if application else "no fault on this node that needs it out",
                }
            )
    drained = {d["target"] for d in drains}
    missing = [
        lab["fault_id"] for lab in faults if _needs_drain(lab) and lab["nodes"] and not set(lab["nodes"]) & drained
    ]
    return {
        "drains": len(drains),
        "correct_drains": len(drains) - len(wrongful),
        "wrongful": wrongful,
        "missing_drains": missing,
    }
