"""The real-world log corpus, replayed one job per excerpt: ``trainguard bench corpus PART``.

``../shared/datasets/real-log-corpus/`` holds real log excerpts from public issue
threads, each labelled with a failure family (or ``normal_progress`` / ``other``)
and the layer the thread's own diagnosis blames. Every excerpt becomes one job
(its own node, lines half a second apart, the real dataflow, no scheduler records
and no GPU telemetry: the logs-only case) in one replay, and is scored:

- **fault vs normal**: a failure excerpt must raise an anomaly; a
  ``normal_progress`` excerpt must raise nothing; an ``other`` excerpt (monitoring
  or configuration noise) may at most raise a notice — no crash or hang, no drain;
- **layer**: the job's first anomaly blames the labelled layer (failure excerpts);
- **family**: the first anomaly's family is the labelled one (reported, not a gate).

``gap_s`` (``--gap S``) moves event time on by ``S`` seconds after the excerpts (a record on
another job), so holds that wait on the clock can fire before the end of the input.
"""

from __future__ import annotations

import json
import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import msgspec

from trainguard.actions.records import Action
from trainguard.detectors.events import Anomaly
from trainguard.detectors.signatures import family_of

CORPUS_DIR = Path(__file__).resolve().parents[3] / "shared" / "datasets" / "real-log-corpus"
EXCERPTS_PATH = CORPUS_DIR.parent / "real-log-excerpts.jsonl"  # the first 52 excerpts, same labels
FAULT_FREE = frozenset({"normal_progress", "other"})
START_TS = 1_800_000_000.0
LINE_INTERVAL_S = 0.5
_LAYER = {"system-software": "system"}


@dataclass(frozen=True)
class Excerpt:
    index: int
    source: str
    text: str
    label: str
    layer: str  # hardware | system | application

    @property
    def is_fault(self) -> bool:
        return self.label not in FAULT_FREE

    @property
    def job_id(self) -> str:
        return f"corpus-{self.index}"


@dataclass(frozen=True)
class ExcerptOutcome:
    excerpt: Excerpt
    anomalies: list[Anomaly]
    drained: bool

    @property
    def first(self) -> Anomaly | None:
        return min(self.anomalies, key=lambda a: (a.detected_at, a.anomaly_id)) if self.anomalies else None

    @property
    def detected_right(self) -> bool:
        """Fault vs normal: the excerpt raised what its label calls for."""
        if self.excerpt.label == "normal_progress":
            return not self.anomalies
        if self.excerpt.label == "other":
            return not self.drained and not any(a.kind in ("crash", "hang") for a in self.anomalies)
        return bool(self.anomalies)

    @property
    def layer_right(self) -> bool:
        return self.first is not None and self.first.layer == self.excerpt.layer

    @property
    def family_right(self) -> bool:
        return self.first is not None and family_of(self.first.category) == self.excerpt.label


def load(path: Path) -> list[Excerpt]:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [
        Excerpt(i, r["source"], r["text"], r["label"], _LAYER.get(r["layer"], r["layer"])) for i, r in enumerate(rows)
    ]


def write_replay(excerpts: list[Excerpt], directory: Path, gap_s: float = 0.0) -> Path:
    """A replay directory with one job per excerpt, all starting at the same event time."""
    from trainguard.agents.logimport import import_lines

    records = []
    for ex in excerpts:
        records += import_lines(
            ex.text.splitlines(),
            job_id=ex.job_id,
            node=f"node-{ex.index:03d}",
            start=START_TS,
            interval=LINE_INTERVAL_S,
        )
    if gap_s > 0:
        end = max(r["ts"] for r in records)
        records.append(
            {"ts": end + gap_s, "job_id": "clock", "node": "clock-node", "source": "app", "line": "clock moves on"}
        )
    records.sort(key=lambda r: r["ts"])
    directory.mkdir(parents=True, exist_ok=True)
    enc = msgspec.json.Encoder()
    (directory / "logs.jsonl").write_bytes(b"".join(enc.encode(r) + b"\n" for r in records))
    return directory


def evaluate(path: Path, gap_s: float = 0.0) -> list[ExcerptOutcome]:
    """Replay every excerpt of ``path`` through the real dataflow and score each."""
    from trainguard.dataflows.pipeline import replay_in_process

    excerpts = load(path)
    with tempfile.TemporaryDirectory() as tmp:
        anomalies, actions, _dead = replay_in_process(write_replay(excerpts, Path(tmp) / "replay", gap_s))
    by_job: dict[str | None, list[Anomaly]] = {}
    for a in anomalies:
        by_job.setdefault(a.job_id, []).append(a)
    drained = _drained_jobs(anomalies, actions)
    return [ExcerptOutcome(ex, by_job.get(ex.job_id, []), ex.job_id in drained) for ex in excerpts]


def _drained_jobs(anomalies: list[Anomaly], actions: list[Action]) -> set[str]:
    job_of = {a.anomaly_id: a.job_id for a in anomalies}
    return {job for x in actions if x.action == "drain_node" and (job := job_of.get(x.anomaly_id)) is not None}


@dataclass(frozen=True)
class CorpusScore:
    excerpts: int
    fault_vs_normal: float
    layer: float  # over failure excerpts
    family: float  # over failure excerpts
    normal_silent: float  # share of normal_progress excerpts with no anomaly


def score(outcomes: list[ExcerptOutcome]) -> CorpusScore:
    faults = [o for o in outcomes if o.excerpt.is_fault]
    normal = [o for o in outcomes if o.excerpt.label == "normal_progress"]
    return CorpusScore(
        excerpts=len(outcomes),
        fault_vs_normal=sum(o.detected_right for o in outcomes) / len(outcomes),
        layer=sum(o.layer_right for o in faults) / max(len(faults), 1),
        family=sum(o.family_right for o in faults) / max(len(faults), 1),
        normal_silent=sum(not o.anomalies for o in normal) / max(len(normal), 1),
    )


def excerpts_path(part: str) -> Path:
    """``tune`` / ``holdout`` of the corpus, or any JSON Lines file of excerpts."""
    return CORPUS_DIR / f"{part}.jsonl" if part in ("tune", "holdout") else Path(part)


def report(part: str = "tune", gap_s: float = 0.0, misses: bool = False) -> CorpusScore:
    """Replay and score one set of excerpts, print the scores (and the misses), return them."""
    path = excerpts_path(part)
    if not path.is_file():
        raise FileNotFoundError(f"no excerpts at {path}: give tune, holdout or a JSON Lines file.")
    outcomes = evaluate(path, gap_s)
    if misses:
        for o in outcomes:
            if o.detected_right and (not o.excerpt.is_fault or (o.layer_right and o.family_right)):
                continue
            got = o.first
            what = "nothing" if got is None else f"{got.kind}/{got.category}/{got.layer}"
            print(f"#{o.excerpt.index} {o.excerpt.label}/{o.excerpt.layer}: got {what}  [{o.excerpt.source}]")
    s = score(outcomes)
    kinds = Counter(a.category for o in outcomes for a in o.anomalies)
    print(
        f"{path.name}: {s.excerpts} excerpts  fault-vs-normal {s.fault_vs_normal:.2f}  layer {s.layer:.2f}  "
        f"family {s.family:.2f}  normal silent {s.normal_silent:.2f}"
    )
    print("categories raised:", dict(kinds.most_common(12)))
    return s
