"""What the console shows, read from a run's outputs: the audit log and the Parquet archive.

Both are tailed: the audit log by byte offset (it is append-only and fsynced per
batch, so recommendations appear within a second), the archive by new files (they
appear when a part rolls). Anomalies come from the archive when it has them and
from the audit entries otherwise (each entry carries its anomaly's essentials).
"""

from __future__ import annotations

import threading
from collections import Counter
from pathlib import Path
from typing import Any

import msgspec

from trainguard.actions.records import Action
from trainguard.dataflows.archive import epoch_times
from trainguard.detectors.events import Anomaly
from trainguard.detectors.lifecycle import latest_records

BUCKET_S = 10.0  # a job's timeline: steps per second over 10 s of event time
PROGRESS_BUCKETS = 360  # one hour of it
_ANOMALY_FIELDS = (
    "onset_ts",
    "kind",
    "category",
    "layer",
    "transient",
    "confidence",
    "job_id",
    "nodes",
    "gpus",
    "evidence",
    "severity",
    "resolved_at",
    "resolution",
)


class ConsoleData:
    """The console's in-memory view; :meth:`refresh` reads what was appended since the last call."""

    def __init__(self, audit_log: Path | None, archive: Path | None = None, progress: Path | None = None) -> None:
        self.audit_log = audit_log
        self.archive = archive
        self.anomalies: dict[str, dict[str, Any]] = {}
        self.audit: list[dict[str, Any]] = []
        self.actions: dict[str, dict[str, Any]] = {}  # action id -> its latest audit entry
        self.version = 0  # bumped whenever something new arrived (the SSE stream watches it)
        self._offset = 0
        self._seen_files: set[Path] = set()
        self._lock = threading.Lock()
        tables = _replay_tables(progress) if progress is not None else {}
        self.progress = _progress(tables)
        self._live_steps: dict[str, tuple[float, set[int]]] = {}  # per job: the live bucket and its steps
        self.gpus = _latest_gpus(tables.get("gpu"))
        self.lanes = _lanes(tables.get("gpu"))
        self.logs = _job_logs(tables.get("logs"))
        self.job_nodes = _job_nodes(tables.get("scheduler"))

    # ------------------------------------------------------------ reading

    def refresh(self) -> bool:
        """Read new audit entries and archive parts; ``True`` if anything changed."""
        with self._lock:
            changed = self._read_audit() | self._read_archive()
            if changed:
                self.version += 1
            return changed

    def _read_audit(self) -> bool:
        if self.audit_log is None or not self.audit_log.exists():
            return False
        with open(self.audit_log, "rb") as fh:
            fh.seek(self._offset)
            chunk = fh.read()
        end = chunk.rfind(b"\n") + 1  # a torn last line waits for its end
        self._offset += end
        changed = False
        for line in chunk[:end].splitlines():
            try:
                entry = msgspec.json.decode(line)
            except msgspec.DecodeError:
                continue
            if not isinstance(entry, dict):
                continue
            changed = True
            self.audit.append(entry)
            if entry.get("action_id"):
                self.actions[entry["action_id"]] = {**self.actions.get(entry["action_id"], {}), **entry}
            aid = entry.get("anomaly_id")
            if aid and aid not in self.anomalies and entry.get("kind"):
                self.anomalies[aid] = {"anomaly_id": aid, "detected_at": entry.get("detected_at")} | {
                    k: entry.get(k) for k in _ANOMALY_FIELDS
                }
        return changed

    def _read_archive(self) -> bool:
        if self.archive is None:
            return False
        import polars as pl

        changed = False
        for path in sorted((self.archive / "anomalies").glob("**/*.parquet")):
            if path in self._seen_files:
                continue
            self._seen_files.add(path)
            for row in pl.read_parquet(path).to_dicts():
                self._put(epoch_times(row))
                changed = True
        return changed

    def add(self, anomalies: list[dict[str, Any]], progress: list[tuple[str, float, int]]) -> None:
        """Anomalies and progress records ``(job, ts, step)`` from a live source (the Kafka topics)."""
        with self._lock:
            for row in anomalies:
                self._put(row)  # at-least-once upstream: the id deduplicates
            for job, ts, step in progress:
                series = self.progress.setdefault(job, [])
                bucket = float(ts // BUCKET_S * BUCKET_S)
                seen = self._live_steps.setdefault(job, (bucket, set()))
                if bucket > seen[0]:
                    seen = self._live_steps[job] = (bucket, set())
                elif bucket < seen[0] or step in seen[1]:
                    continue  # late, or another rank's record of a step already counted
                seen[1].add(step)
                if series and series[-1][0] == bucket:
                    series[-1][1] += 1.0 / BUCKET_S
                else:
                    series.append([bucket, 1.0 / BUCKET_S])
                    del series[:-PROGRESS_BUCKETS]  # keep the last hour
            self.version += 1

    def _put(self, row: dict[str, Any]) -> None:
        """Keep one record per anomaly: its resolution once there is one, whatever order they came in."""
        self.anomalies[row["anomaly_id"]] = latest_records([self.anomalies.get(row["anomaly_id"]) or row, row])[0]

    # ------------------------------------------------------------ views

    def feed(self, limit: int = 100) -> list[dict[str, Any]]:
        with self._lock:
            rows = sorted(self.anomalies.values(), key=lambda a: a.get("detected_at") or 0, reverse=True)
            return rows[:limit]

    def incidents(
        self,
        filters: dict[str, str],
        since: float | None = None,
        offset: int = 0,
        limit: int = 25,
    ) -> dict[str, Any]:
        """One page of anomalies, newest first, matching ``filters`` (kind, layer, node, job, status:
        open or resolved) and detected at or after ``since`` (event time); each with its actions."""
        with self._lock:
            newest = max((a.get("detected_at") or 0 for a in self.anomalies.values()), default=0)
            rows = [a for a in self.anomalies.values() if _matches(a, filters, since)]
            rows.sort(key=lambda a: a.get("detected_at") or 0, reverse=True)
            page = rows[offset : offset + limit]
            by_anomaly: dict[str, list[dict[str, Any]]] = {}
            for action in self.actions.values():
                by_anomaly.setdefault(action.get("anomaly_id") or "", []).append(
                    {k: action.get(k) for k in ("action", "target", "event", "driver", "mode")}
                )
            return {
                "total": len(rows),
                "offset": offset,
                "newest": newest,
                "rows": [{**a, "actions": by_anomaly.get(a["anomaly_id"], [])} for a in page],
                "kinds": sorted({a.get("kind") or "unknown" for a in self.anomalies.values()}),
                "layers": sorted({a.get("layer") or "unknown" for a in self.anomalies.values()}),
            }

    def trends(self, since: float | None = None, buckets: int = 24) -> dict[str, Any]:
        """Over the range (event time, from ``since`` to the newest detection) in ``buckets`` steps:
        anomalies opened per kind, actions per status (each action's latest state, when it was
        decided), and each anomaly's time to detect (detection minus onset)."""
        with self._lock:
            anomalies = [a for a in self.anomalies.values() if a.get("detected_at")]
            actions = [a for a in self.actions.values() if a.get("decided_at") and a.get("action") != "notify"]
        if not anomalies:
            return {"t": [], "anomalies": {}, "actions": {}, "detect": []}
        newest = max(a["detected_at"] for a in anomalies)
        start = since if since is not None else min(a["detected_at"] for a in anomalies)
        step = max(60.0, (newest - start) / buckets)
        starts = [start + i * step for i in range(max(1, int((newest - start) // step) + 1))]

        def tally(rows: list[dict[str, Any]], time_of: str, key_of: str) -> dict[str, list[int]]:
            out: dict[str, list[int]] = {}
            for row in rows:
                t = row[time_of]
                if t is None or t < start or t > newest:
                    continue
                index = min(len(starts) - 1, int((t - start) // step))
                out.setdefault(str(row.get(key_of) or "unknown"), [0] * len(starts))[index] += 1
            return out

        detect = [
            [a["detected_at"], round(a["detected_at"] - a["onset_ts"], 1), a.get("kind")]
            for a in anomalies
            if a.get("onset_ts") and a["detected_at"] >= start
        ]
        return {
            "t": starts,
            "step_s": step,
            "anomalies": tally(anomalies, "detected_at", "kind"),
            "actions": tally(actions, "decided_at", "event"),
            "detect": sorted(detect),
        }

    def pending(self) -> list[dict[str, Any]]:
        """Recommendations nobody has approved or rejected yet (monitor mode or an open breaker)."""
        with self._lock:
            return [a for a in self.actions.values() if _pending(a)]

    def overview(self) -> dict[str, Any]:
        with self._lock:
            newest = max((a.get("detected_at") or 0 for a in self.anomalies.values()), default=0)
            recent = [a for a in self.anomalies.values() if (a.get("detected_at") or 0) >= newest - 3600]
            breaker = next((e for e in reversed(self.audit) if e.get("event") == "breaker"), None)
            drained = sorted(
                {
                    a["target"]
                    for a in self.actions.values()
                    if a.get("action") == "drain_node" and a.get("event") == "applied"
                }
            )
            return {
                "anomalies_last_hour": dict(Counter(a["kind"] for a in recent)),
                "anomalies_total": len(self.anomalies),
                "jobs": sorted({a["job_id"] for a in self.anomalies.values() if a.get("job_id")} | set(self.progress)),
                "drained_by_trainguard": drained,
                "breaker": {"open": bool(breaker and breaker.get("open")), "reason": (breaker or {}).get("reason")},
                "pending": sum(1 for a in self.actions.values() if _pending(a)),
            }

    def job(self, job_id: str) -> dict[str, Any]:
        with self._lock:
            anomalies = [a for a in self.anomalies.values() if a.get("job_id") == job_id]
            actions = [a for a in self.actions.values() if a.get("job_id") == job_id or a.get("target") == job_id]
            lines = self.logs.get(job_id, [])
            nodes = self.job_nodes.get(job_id) or sorted({n for a in anomalies for n in a.get("nodes") or []})
            return {
                "job_id": job_id,
                "progress": self.progress.get(job_id, []),
                "lanes": {node: self.lanes[node] for node in nodes if node in self.lanes},
                "anomalies": [{**a, "log": _around(lines, a.get("detected_at"))} for a in anomalies],
                "actions": actions,
            }

    def nodes(self) -> list[dict[str, Any]]:
        with self._lock:
            per_node: dict[str, dict[str, Any]] = {}
            for a in self.anomalies.values():
                for node in a.get("nodes") or []:
                    info = per_node.setdefault(node, {"node": node, "anomalies": Counter(), "drained": False})
                    info["anomalies"][a["kind"]] += 1
            for a in self.actions.values():
                if a.get("action") == "drain_node" and _applied(a) and a["target"] in per_node:
                    per_node[a["target"]]["drained"] = True
            return [{**v, "anomalies": dict(v["anomalies"])} for _, v in sorted(per_node.items())]

    def cluster_map(self) -> dict[str, Any]:
        """Nodes × GPUs, each GPU's health from the anomalies and the actions (see :func:`gpu_health`),
        with its latest telemetry when a replay directory gave some."""
        with self._lock:
            drained = {a["target"] for a in self.actions.values() if a.get("action") == "drain_node" and _applied(a)}
            nodes = set(self.gpus) | {n for a in self.anomalies.values() for n in a.get("nodes") or []}
            width = max([len(g) for g in self.gpus.values()] + [8])
            rows = []
            for node in sorted(nodes):
                telemetry = self.gpus.get(node, {})
                indexes = sorted(set(range(width)) | set(telemetry)) if telemetry else list(range(width))
                cells = []
                for gpu in indexes:
                    health, why = gpu_health(node, gpu, self.anomalies.values(), node in drained)
                    cells.append({"gpu": gpu, "health": health, "why": why, **telemetry.get(gpu, {})})
                rows.append({"node": node, "drained": node in drained, "reported": bool(telemetry), "gpus": cells})
            return {"nodes": rows, "levels": list(HEALTH_LEVELS)}

    def node(self, node: str) -> dict[str, Any]:
        """One node: its GPUs (health and latest telemetry), anomalies and actions."""
        row = next((r for r in self.cluster_map()["nodes"] if r["node"] == node), None)
        with self._lock:
            anomalies = [a for a in self.anomalies.values() if node in (a.get("nodes") or [])]
            actions = [a for a in self.actions.values() if a.get("target") == node]
        anomalies.sort(key=lambda a: a.get("detected_at") or 0, reverse=True)
        return {"node": node, "known": row is not None, **(row or {}), "anomalies": anomalies, "actions": actions}

    def audit_trail(self, offset: int = 0, limit: int = 50) -> dict[str, Any]:
        """One page of the audit trail, newest first, and how many entries there are in all.

        ``driver`` says what carried an entry out: the scheduler driver's name, ``dry-run``, or
        ``None`` for a recommendation nobody ran.
        """
        keep = ("recorded_at", "decided_at", "event", "action", "target", "mode", "driver", "noop")
        keep += ("job_id", "category", "reason", "user")
        with self._lock:
            total = len(self.audit)
            end = max(0, total - offset)
            rows = self.audit[max(0, end - limit) : end]
            return {"total": total, "offset": offset, "rows": [{k: e.get(k) for k in keep} for e in reversed(rows)]}

    def decision(self, action_id: str) -> tuple[Anomaly, Action] | None:
        """The anomaly and action behind a recommendation, rebuilt for the executor."""
        with self._lock:
            entry = self.actions.get(action_id)
            if entry is None:
                return None
            anomaly = self.anomalies.get(entry.get("anomaly_id") or "", {})
        action = Action(
            action_id=action_id,
            anomaly_id=entry["anomaly_id"],
            decided_at=entry.get("decided_at") or 0.0,
            action=entry["action"],
            target=entry["target"],
            params=entry.get("params") or {},
            mode=entry.get("mode") or "monitor",
            status="recommended",
            reason=_original_reason(entry.get("reason") or ""),
        )
        fields = {k: anomaly.get(k, entry.get(k)) for k in _ANOMALY_FIELDS}
        return (
            Anomaly(
                anomaly_id=entry["anomaly_id"],
                detected_at=entry.get("detected_at") or 0.0,
                kind=fields["kind"] or "unknown",
                category=fields["category"] or "unknown",
                layer=fields["layer"] or "unknown",
                transient=fields["transient"],
                confidence=fields["confidence"] if fields["confidence"] is not None else 0.5,
                job_id=fields["job_id"],
                nodes=list(fields["nodes"] or []),
                gpus=list(fields["gpus"] or []),
                evidence=list(fields["evidence"] or []),
            ),
            action,
        )


def _matches(anomaly: dict[str, Any], filters: dict[str, str], since: float | None) -> bool:
    if since is not None and (anomaly.get("detected_at") or 0) < since:
        return False
    for field in ("kind", "layer"):
        if filters.get(field) and anomaly.get(field) != filters[field]:
            return False
    if filters.get("node") and filters["node"] not in (anomaly.get("nodes") or []):
        return False
    if filters.get("job") and str(anomaly.get("job_id")) != filters["job"]:
        return False
    status = filters.get("status")
    return not status or (status == "resolved") == bool(anomaly.get("resolved_at"))


HEALTH_LEVELS = ("ok", "watched", "suspect", "drained", "lost")
_LOST = frozenset({"gpu_lost", "xid_79"})  # fallen off the bus: the GPU is gone until the node is reset


def gpu_health(node: str, gpu: int, anomalies: Any, drained: bool) -> tuple[str, str]:
    """A GPU's health and why: ``lost`` (its anomaly says it fell off the bus), ``drained`` (its node
    is), ``suspect`` (an open anomaly names it or, naming no GPU, its node), ``watched`` (a warning,
    or a resolved anomaly), else ``ok``.

    >>> a = {"anomaly_id": "an-1", "kind": "node_unhealthy", "category": "ecc_sbe_burst", "nodes": ["n1"],
    ...      "gpus": ["n1/2"], "severity": "critical", "resolved_at": None}
    >>> gpu_health("n1", 2, [a], False), gpu_health("n1", 3, [a], False), gpu_health("n1", 3, [a], True)
    (('suspect', 'node_unhealthy/ecc_sbe_burst (an-1)'), ('ok', ''), ('drained', 'node drained'))
    """
    level, why = 0, ""
    for a in anomalies:
        if node not in (a.get("nodes") or []):
            continue
        named = [g.split("/", 1)[1] for g in a.get("gpus") or [] if g.startswith(f"{node}/")]
        indexes = {int(g) for g in named if g.isdigit()}
        if indexes and gpu not in indexes:
            continue  # it names other GPUs of the node
        if a.get("category") in _LOST and (gpu in indexes or (not indexes and not named)):
            found = 4
        elif a.get("resolved_at") or a.get("severity") == "warning":
            found = 1
        else:
            found = 2
        if found > level:
            level, why = found, f"{a.get('kind')}/{a.get('category')} ({a.get('anomaly_id')})"
    if drained and level < 3:
        level, why = 3, "node drained"
    return HEALTH_LEVELS[level], why


def _pending(entry: dict[str, Any]) -> bool:
    """A recommendation nobody has approved or rejected yet (a notification needs no decision)."""
    return entry.get("event") == "recommended" and entry.get("action") != "notify"


def _applied(entry: dict[str, Any]) -> bool:
    return entry.get("event") == "applied" and not entry.get("noop")


def _original_reason(reason: str) -> str:
    # A breaker-held drain's reason says why it was held; the scheduler should get the anomaly's.
    return reason.split("; circuit breaker open:")[0]


_GPU_FIELDS = ("util_pct", "power_w", "temp_c", "sm_clock_mhz", "mem_used_mib")
_GPU_FIELDS += ("ecc_sbe_total", "ecc_dbe_total", "pcie_replay_total", "nvlink_crc_total")
LANE_S = 60.0  # a node's GPU lane: the mean of its GPUs over a minute of event time
LOG_LINES_KEPT = 20_000  # per job: the console shows lines around anomalies, not whole logs
LOG_CONTEXT = 6  # lines shown before an anomaly's detection, and after


def _replay_tables(directory: Path) -> dict[str, Any]:
    """Each topic of a replay directory as one polars frame (its files as ``replay`` finds them),
    ``ts`` in epoch seconds: read once, for every view the console draws from it."""
    import polars as pl

    from trainguard.dataflows.replay import ReplayError, topic_files

    try:
        found = topic_files(directory)
    except ReplayError:
        return {}
    tables: dict[str, Any] = {}
    for topic, paths in found.items():
        frames = [pl.read_parquet(p) if p.suffix == ".parquet" else pl.read_ndjson(p) for p in paths]
        frame = pl.concat(frames, how="diagonal_relaxed")
        if "ts" in frame.columns:
            ts = pl.col("ts")
            if frame.schema["ts"] == pl.Utf8:
                ts = ts.str.to_datetime(time_zone="UTC").dt.epoch("ms") / 1000
            tables[topic] = frame.with_columns(ts.cast(pl.Float64).alias("ts"))
    return tables


def _latest_gpus(frame: Any) -> dict[str, dict[int, dict[str, Any]]]:
    """Per node, per GPU index, its latest telemetry (``ts`` included)."""
    import polars as pl

    if frame is None:
        return {}
    fields = [f for f in _GPU_FIELDS if f in frame.columns]
    latest = (
        frame.sort("ts")
        .group_by("node", "gpu")
        .agg(pl.col("ts").last(), *[pl.col(f).drop_nulls().last() for f in fields])
    )
    out: dict[str, dict[int, dict[str, Any]]] = {}
    for row in latest.iter_rows(named=True):
        node, gpu = row.pop("node"), row.pop("gpu")
        out.setdefault(node, {})[int(gpu)] = row
    return out


def _progress(tables: dict[str, Any]) -> dict[str, list[list[float]]]:
    """Per job, ``[time, steps per second]`` over 10 s buckets of event time: distinct steps from
    the progress records, and from the log lines a framework prints (Megatron, torchtitan, …)."""
    import polars as pl

    from trainguard.detectors.progress_parsers import parse_progress

    steps: list[pl.DataFrame] = []
    if "progress" in tables:
        steps.append(tables["progress"].select("ts", pl.col("job_id").cast(pl.Utf8), pl.col("step").cast(pl.Int64)))
    if "logs" in tables:
        frame = tables["logs"].filter(pl.col("job_id").is_not_null())
        lines = frame.select("ts", pl.col("job_id").cast(pl.Utf8), "line").iter_rows()
        parsed = [(t, job, p.step) for t, job, line in lines if (p := parse_progress(line)) and p.step]
        if parsed:
            steps.append(pl.DataFrame(parsed, schema=["ts", "job_id", "step"], orient="row"))
    if not steps:
        return {}
    buckets = (
        pl.concat(steps, how="vertical_relaxed")
        .with_columns((pl.col("ts") // BUCKET_S * BUCKET_S).alias("t"))
        .group_by("job_id", "t")
        .agg((pl.col("step").n_unique() / BUCKET_S).alias("rate"))
        .sort("job_id", "t")
    )
    out: dict[str, list[list[float]]] = {}
    for job, t, rate in buckets.iter_rows():
        out.setdefault(job, []).append([float(t), float(rate)])
    return out


def _lanes(frame: Any) -> dict[str, list[list[float | None]]]:
    """Per node, ``[time, mean utilisation %, mean power W]`` per minute of event time."""
    import polars as pl

    if frame is None:
        return {}
    columns = [pl.col(c).cast(pl.Float64).mean().alias(c) for c in ("util_pct", "power_w") if c in frame.columns]
    if not columns:
        return {}
    per_minute = (
        frame.with_columns((pl.col("ts") // LANE_S * LANE_S).alias("t"))
        .group_by("node", "t")
        .agg(*columns)
        .sort("node", "t")
    )
    lanes: dict[str, list[list[float | None]]] = {}
    for row in per_minute.iter_rows(named=True):
        lanes.setdefault(row["node"], []).append([row["t"], row.get("util_pct"), row.get("power_w")])
    return lanes


def _job_nodes(frame: Any) -> dict[str, list[str]]:
    """Per job, the nodes its scheduler records put it on (the last record that names some)."""
    out: dict[str, list[str]] = {}
    for row in frame.to_dicts() if frame is not None else ():
        if row.get("kind") == "job" and row.get("nodes"):
            out[str(row["job_id"])] = list(row["nodes"])
    return out


def _job_logs(frame: Any) -> dict[str, list[tuple[float, str]]]:
    """Per job, its log lines ``(ts, "[rank] line")`` in time order (the last ``LOG_LINES_KEPT``)."""
    import polars as pl

    if frame is None:
        return {}
    rank = pl.col("rank").cast(pl.Utf8) if "rank" in frame.columns else pl.lit(None, dtype=pl.Utf8)
    frame = (
        frame.filter(pl.col("job_id").is_not_null())
        .select("ts", pl.col("job_id").cast(pl.Utf8), rank.alias("rank"), "line")
        .sort("ts")
    )
    out: dict[str, list[tuple[float, str]]] = {}
    for ts, job, rank_text, line in frame.iter_rows():
        out.setdefault(job, []).append((ts, f"[{rank_text}] {line}" if rank_text is not None else line))
    return {job: lines[-LOG_LINES_KEPT:] for job, lines in out.items()}


def _around(lines: list[tuple[float, str]], ts: float | None) -> list[list[Any]]:
    """The job's log lines just before and after ``ts`` (event time)."""
    if ts is None or not lines:
        return []
    import bisect

    at = bisect.bisect_right(lines, (ts, "\uffff"))
    return [[t, line] for t, line in lines[max(0, at - LOG_CONTEXT) : at + LOG_CONTEXT]]
