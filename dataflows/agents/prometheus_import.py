"""Import GPU history from Prometheus: dcgm-exporter series → a replay directory of ``gpu`` samples.

A cluster's Prometheus already holds weeks of dcgm-exporter telemetry. :func:`import_prometheus`
reads it through the HTTP API's ``query_range``, one metric and one time chunk at a time (a
chunk is ``chunk_steps`` steps: a week of a 1,000-GPU cluster never sits in memory, and no
query asks for more points than Prometheus serves per series), turns each step into one
sample per GPU with the same mapping as the live scraper (:mod:`trainguard.agents.dcgm`),
and writes each chunk as a Parquet file of the ``gpu`` topic: ``OUT/gpu/part-00000.parquet``, …
— a replay directory ``trainguard replay`` and ``tune`` read as they are, next to the
``logs.jsonl`` that ``import-logs`` writes.
"""

from __future__ import annotations

import json
import math
import re
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from trainguard.agents.dcgm import FIELDS, INTEGER_FIELDS, GpuFrames, GpuKey

DEFAULT_MATCH = "DCGM_FI_DEV_.*"
# The Parquet schema of the gpu topic: every wire-contract field the mapping can fill.
SCHEMA = pa.schema(
    [("ts", pa.float64()), ("node", pa.string()), ("gpu", pa.int64()), ("uuid", pa.string())]
    + [("pci_bus_id", pa.string())]
    + [(f, pa.int64() if f in INTEGER_FIELDS else pa.float64()) for f in dict.fromkeys(FIELDS.values())]
)


class PrometheusImportError(ValueError):
    """The import cannot go on; one sentence says why."""


@dataclass
class Imported:
    directory: Path
    samples: int
    files: int
    series: int
    metrics: list[str]


def parse_step(text: str) -> float:
    """``15s``, ``1m``, ``500ms``, ``1h`` or plain seconds → seconds.

    >>> parse_step("15s"), parse_step("1m"), parse_step("500ms"), parse_step("2")
    (15.0, 60.0, 0.5, 2.0)
    """
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*", text)
    if match is None or float(match[1]) <= 0:
        raise PrometheusImportError(f"--step {text!r} is not a duration like 15s, 1m or 500ms.")
    return float(match[1]) * {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}[match[2]]


class PrometheusApi:
    """The few calls of Prometheus' HTTP API the import needs."""

    def __init__(self, url: str, timeout_s: float = 60.0) -> None:
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s

    def get(self, path: str, params: dict[str, str | float]) -> Any:
        query = urllib.parse.urlencode(params)
        try:
            with urllib.request.urlopen(f"{self.url}{path}?{query}", timeout=self.timeout_s) as response:
                body = json.loads(response.read())
        except urllib.error.HTTPError as exc:
            try:
                body = json.loads(exc.read())
            except ValueError:
                raise PrometheusImportError(f"Prometheus at {self.url} answered HTTP {exc.code}.") from None
        except (OSError, ValueError) as exc:
            why = " ".join(str(getattr(exc, "reason", exc)).split())[:160]
            raise PrometheusImportError(
                f"cannot query Prometheus at {self.url} ({why}); check the URL (e.g. http://prometheus:9090)."
            ) from None
        if body.get("status") != "success":
            raise PrometheusImportError(f"Prometheus refused the query: {body.get('error', 'no reason given')}.")
        return body["data"]

    def metric_names(self, match: str, start: float, end: float) -> list[str]:
        names = self.get("/api/v1/label/__name__/values", {"start": start, "end": end})
        pattern = re.compile(match)
        return sorted(n for n in names if pattern.fullmatch(n) and n in FIELDS)

    def query_range(self, query: str, start: float, end: float, step: float) -> list[dict[str, Any]]:
        return self.get("/api/v1/query_range", {"query": query, "start": start, "end": end, "step": step})["result"]


def chunks(start: float, end: float, step: float, chunk_steps: int) -> Iterator[tuple[float, float]]:
    """Consecutive ``[first, last]`` step-aligned ranges covering ``start``..``end``, none overlapping.

    >>> list(chunks(0, 50, 10, 2))
    [(0, 10), (20, 30), (40, 50)]
    """
    first = start
    while first <= end:
        last = min(first + (chunk_steps - 1) * step, end)
        yield first, last
        first = last + step


def import_prometheus(
    url: str,
    out: Path,
    start: float,
    end: float,
    step: float,
    match: str = DEFAULT_MATCH,
    chunk_steps: int = 120,
    on_chunk: Callable[[int, int], None] | None = None,
) -> Imported:
    """Write ``out/gpu/part-NNNNN.parquet`` from the dcgm-exporter series of Prometheus at ``url``."""
    if end <= start:
        raise PrometheusImportError("--end must be after --start.")
    try:
        re.compile(match)
    except re.error as exc:
        raise PrometheusImportError(f"--match {match!r} is not a regular expression ({exc}).") from None
    api = PrometheusApi(url)
    names = api.metric_names(match, start, end)
    if not names:
        raise PrometheusImportError(
            f"Prometheus at {url} holds no dcgm-exporter series matching {match!r} between those times."
        )
    folder = out / "gpu"
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.glob("part-*.parquet"):
        old.unlink()  # a re-import replaces, never mixes
    frames = GpuFrames()
    samples = files = 0
    series: set[tuple[str, tuple[tuple[str, str], ...]]] = set()
    ranges = list(chunks(start, end, step, chunk_steps))
    for number, (first, last) in enumerate(ranges):
        at: dict[float, dict[GpuKey, dict[str, Any]]] = {}
        for name in names:
            for result in api.query_range(name, first, last, step):
                labels = result["metric"]
                series.add((name, tuple(sorted(labels.items()))))
                fallback = labels.get("instance", "unknown").rsplit(":", 1)[0]
                for ts, value in result["values"]:
                    stamp = float(ts)
                    frames.add(at.setdefault(stamp, {}), name, labels, _number(value), stamp, fallback)
        rows = [record for stamp in sorted(at) for record in frames.finish(at[stamp])]
        if rows:
            pq.write_table(pa.Table.from_pylist(rows, schema=SCHEMA), folder / f"part-{files:05d}.parquet")
            files += 1
            samples += len(rows)
        if on_chunk is not None:
            on_chunk(number + 1, len(ranges))
    return Imported(folder.parent, samples, files, len(series), names)


def _number(value: str) -> float:
    try:
        return float(value)
    except ValueError:
        return math.nan  # dropped by the mapping, like a NaN on the page
