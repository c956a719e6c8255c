"""The real-world log corpus, each excerpt replayed as one job through the real dataflow.

``tune`` is what the catalogue was grown on; ``holdout`` was never looked at while tuning
(its numbers are regression floors, not targets we tuned to); the fixtures are more
sets of real excerpts from other public threads (``tests/fixtures/extra-real-logs*.jsonl``).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import replay
from tests.support.paths import FIXTURES
from trainguard.benchmarks.corpus import CORPUS_DIR, evaluate, score

needs_corpus = pytest.mark.skipif(
    not CORPUS_DIR.is_dir(), reason=f"real-log corpus not found at {CORPUS_DIR} (shared/datasets beside the checkout)"
)


@needs_corpus
@pytest.mark.parametrize(
    ("part", "fault_vs_normal", "layer"),
    # holdout 0.862 -> 0.844 when torchelastic's "Received 15 death signal" with nothing failing before it became a
    # requested stop (scancel, a pod deleted) rather than a crash: measured with the rule on and off, never inspected.
    [("tune", 0.97, 0.92), ("holdout", 0.84, 0.70)],
)
def test_corpus_parts_hold_their_measured_accuracy(part: str, fault_vs_normal: float, layer: float) -> None:
    s = score(evaluate(CORPUS_DIR / f"{part}.jsonl"))
    assert s.fault_vs_normal >= fault_vs_normal and s.layer >= layer, s
    assert s.normal_silent >= 0.95, s  # healthy progress and look-alikes raise nothing


# (set, floor): every set was measured first, then tuned on; the floors sit just under what each scores now.
EXTRA_SETS = [
    ("extra-real-logs.jsonl", 0.95),
    *((f"extra-real-logs-{part}.jsonl", 0.95) for part in ("3b", "4a", "4b", "5a", "5b")),
    ("extra-real-logs-6a.jsonl", 0.92),  # NCCL's connect retries are evidence only: one excerpt ends on them
    ("extra-real-logs-6b.jsonl", 0.94),
    ("extra-real-logs-7a.jsonl", 0.85),  # infrastructure: DCGM tables, ibdiagnet reports, barrier waits missed
    ("extra-real-logs-7b.jsonl", 0.95),
    ("extra-real-logs-8a.jsonl", 0.95),
    ("extra-real-logs-8b.jsonl", 0.95),
    ("extra-real-logs-9.jsonl", 0.90),  # node-health tooling and kernel logs: NVLink checks by design, Xid 63
]

# Sealed halves of sets 7a/7b/8a/8b/9 (split by repository before anyone looked): never tuned on, like the holdout;
# the floors are what they scored at first contact, so a change that loses what we had fails here.
SEALED_SETS = [
    ("sealed-real-logs-7a.jsonl", 0.80, 0.60),
    ("sealed-real-logs-7b.jsonl", 0.95, 0.85),
    ("sealed-real-logs-8a.jsonl", 0.75, 0.30),
    ("sealed-real-logs-8b.jsonl", 0.95, 0.95),
    ("sealed-real-logs-9.jsonl", 0.50, 0.20),  # 8 excerpts, 5 of them failures
]


@pytest.mark.parametrize(("name", "fault_vs_normal", "layer"), SEALED_SETS)
def test_sealed_sets_hold_their_first_contact_accuracy(name: str, fault_vs_normal: float, layer: float) -> None:
    s = score(evaluate(FIXTURES / name))
    assert s.fault_vs_normal >= fault_vs_normal and s.layer >= layer and s.normal_silent >= 0.95, s


@pytest.mark.parametrize(("name", "floor"), EXTRA_SETS)
def test_more_real_excerpts_from_other_threads(name: str, floor: float) -> None:
    s = score(evaluate(FIXTURES / name))
    assert s.fault_vs_normal >= floor and s.normal_silent >= 0.95, s


def test_a_crashed_jobs_log_that_ends_in_held_lines_is_reported_at_the_end_of_the_replay(tmp_path: Path) -> None:
    """Logs only: a lone NCCL watchdog timeout (no scheduler record, no root cause) is the anomaly."""
    line = (
        "[rank3]:[E1201 10:35:00.5 ProcessGroupNCCL.cpp:632] [Rank 3] Watchdog caught collective operation timeout: "
        "WorkNCCL(SeqNum=9, OpType=ALLREDUCE, Timeout(ms)=600000) ran for 600013 milliseconds before timing out."
    )
    logs = tmp_path / "logs.jsonl"
    logs.write_text(
        "".join(
            f'{{"ts": {1796205600.0 + i}, "job_id": "5", "node": "n1", "rank": {i}, "line": {line!r}}}\n'.replace(
                "'", '"'
            )
            for i in range(3)
        )
    )
    result = replay(tmp_path)
    (anomaly,) = result.anomalies
    assert (anomaly.category, anomaly.layer, anomaly.transient) == ("nccl_timeout", "system", True)
    assert anomaly.detected_at == 1796205600.0 + 10.0  # when the hold would have fired, in event time
    assert [a.action for a in result.actions] == ["requeue_job"]


def test_fatal_lines_no_signature_explains_become_crash_unclassified(tmp_path: Path) -> None:
    lines = [
        "step 10 | loss 2.1",
        "terminate called after throwing an instance of 'flux::CapacitorError'",
        "  what():  capacitor overloaded",
    ]
    (tmp_path / "logs.jsonl").write_text(
        "".join(
            f'{{"ts": {1796205600.0 + i}, "job_id": "5", "node": "n1", "line": "{t}"}}\n' for i, t in enumerate(lines)
        )
    )
    (anomaly,) = replay(tmp_path).anomalies
    assert (anomaly.kind, anomaly.category, anomaly.layer) == ("crash", "unclassified", "unknown")
    assert any("CapacitorError" in e for e in anomaly.evidence)
    assert any(e.startswith("template: ") for e in anomaly.evidence)
