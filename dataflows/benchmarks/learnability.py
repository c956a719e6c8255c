"""Could a learned model carry what the catalogue misses? ``trainguard bench learnability``.

The signature catalogue is written by hand from real excerpts, and what it learns from
one collection round carries little to the next (docs/benchmarks.md). This measures
whether a *learned* reader would do better on wordings it has never seen, before anyone
builds one. Only open excerpts are used (``tune`` and the open parts of later rounds,
never ``holdout`` or a sealed part), and every number is out of group: the excerpts of
one collection round (``tune`` split in four by repository) are scored by a model
trained on all the others, so a wording is never seen in training and in scoring both.

Two questions, both with river's online logistic regression over the words and word
pairs of a line, stamps, ranks and numbers removed:

- **A fault reader.** Trained on the lines the catalogue recognises in failure excerpts
  (positive) against every line of normal and noise excerpts (negative). An excerpt is
  flagged when one of its lines scores over a threshold, read where the threshold flags
  0, 1, 2 and 5 % of the healthy excerpts. Reported: failure excerpts flagged, and, what
  a fallback would be for, failure excerpts the catalogue does not recognise at all.
- **A layer reader.** Trained on whole failure excerpts (their words and the category
  the flow raised) to name the layer, against the catalogue's layer on the same excerpts,
  and against the best any reader of the category alone could do (its majority layer).
"""

from __future__ import annotations

import hashlib
import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from river import compose, feature_extraction, linear_model, multiclass, optim

from trainguard.benchmarks.corpus import CORPUS_DIR, Excerpt, evaluate
from trainguard.detectors.signatures import looks_fatal, match_line, strip_envelope

FIXTURES = Path(__file__).resolve().parents[2] / "tests" / "fixtures"
EPOCHS = 3
_WORD = re.compile(r"[A-Za-z_][A-Za-z_]+")


def open_parts() -> list[Path]:
    """``tune`` and the open parts of every later collection round, never a held-out part."""
    return [CORPUS_DIR / "tune.jsonl", *sorted(FIXTURES.glob("extra-real-logs*.jsonl"))]


def words(text: str) -> list[str]:
    """The lower-case words of ``text``, one line at a time without its envelope; numbers dropped.

    >>> words("[rank3]: RuntimeError: NCCL error in: ProcessGroupNCCL.cpp:1191, unhandled system error")
    ['runtimeerror', 'nccl', 'error', 'in', 'processgroupnccl', 'cpp', 'unhandled', 'system', 'error']
    """
    return [w.lower() for line in text.splitlines() for w in _WORD.findall(strip_envelope(line))]


def _reader(l2: float = 0.0, one_of_many: bool = False) -> compose.Pipeline:
    """Words and word pairs into a logistic regression: yes/no, or one of many classes (one vs rest)."""
    model = linear_model.LogisticRegression(optimizer=optim.SGD(0.1), l2=l2)
    return feature_extraction.BagOfWords(tokenizer=words, ngram_range=(1, 2)) | (
        multiclass.OneVsRestClassifier(model) if one_of_many else model
    )


@dataclass(frozen=True)
class Labelled:
    group: str  # the collection round, ``tune`` in four parts by repository
    excerpt: Excerpt
    category: str | None  # what the flow raised first, if anything
    layer: str | None


def labelled(paths: Iterable[Path]) -> list[Labelled]:
    """Every excerpt of ``paths`` with its group and what the real flow raised on it."""
    paths = list(paths)
    for path in paths:
        name = path.resolve().name  # a link or a copy's link to a held-out part is still held out
        if name == "holdout.jsonl" or name.startswith("sealed-"):
            raise ValueError(f"{path} is held out: learn only from tune and the open parts.")
    out = []
    for path in paths:
        try:
            outcomes = evaluate(path)
        except (ValueError, KeyError) as exc:
            raise ValueError(
                f"{path} is not JSON Lines of excerpts with source, text, label and layer ({exc})."
            ) from None
        for outcome in outcomes:
            ex = outcome.excerpt
            group = path.stem
            if path.name == "tune.jsonl":
                repo = ex.source.split(" ")[0]
                group = f"tune-{int(hashlib.sha1(repo.encode()).hexdigest(), 16) % 4}"
            first = outcome.first
            out.append(Labelled(group, ex, first and first.category, first and first.layer))
    groups = {r.group for r in out}
    if len(groups) < 2 or all(r.excerpt.is_fault for r in out) or not any(r.excerpt.is_fault for r in out):
        raise ValueError(
            "learnability needs at least two files (or tune), with both failure and healthy excerpts among them."
        )
    return out


def _folds(rows: list[Labelled]) -> Iterator[tuple[list[Labelled], list[Labelled]]]:
    for group in sorted({r.group for r in rows}):
        yield [r for r in rows if r.group != group], [r for r in rows if r.group == group]


def _lines(ex: Excerpt) -> list[str]:
    return [line for line in ex.text.splitlines() if line.strip()]


def _excerpt_score(model: compose.Pipeline, ex: Excerpt) -> float:
    return max((model.predict_proba_one(line).get(True, 0.0) for line in _lines(ex)), default=0.0)


@dataclass(frozen=True)
class FaultReaderPoint:
    healthy_flagged: float  # share of normal and noise excerpts with a line over the threshold
    faults_flagged: float
    unrecognised_flagged: tuple[int, int]  # failures the catalogue matches no line of: flagged, of


def fault_reader(
    rows: list[Labelled], healthy_flagged: Iterable[float] = (0.0, 0.01, 0.02, 0.05)
) -> list[FaultReaderPoint]:
    """Out-of-group excerpt scores, read at thresholds that flag the given shares of healthy excerpts."""
    scores: list[tuple[float, Labelled]] = []
    for train, test in _folds(rows):
        model = _reader()
        examples = [
            (line, r.excerpt.is_fault)
            for r in train
            for line in _lines(r.excerpt)
            if not r.excerpt.is_fault or match_line(line) is not None
        ]
        for _ in range(EPOCHS):
            for line, y in examples:
                model.learn_one(line, y)
        scores += [(_excerpt_score(model, r.excerpt), r) for r in test]
    healthy = sorted((s for s, r in scores if not r.excerpt.is_fault), reverse=True)
    faults = [(s, r) for s, r in scores if r.excerpt.is_fault]
    unrecognised = [s for s, r in faults if not any(match_line(x) or looks_fatal(x) for x in _lines(r.excerpt))]
    points = []
    for share in healthy_flagged:
        threshold = healthy[min(int(len(healthy) * share), len(healthy) - 1)]
        points.append(
            FaultReaderPoint(
                healthy_flagged=sum(s > threshold for s in healthy) / len(healthy),
                faults_flagged=sum(s > threshold for s, _ in faults) / len(faults),
                unrecognised_flagged=(sum(s > threshold for s in unrecognised), len(unrecognised)),
            )
        )
    return points


@dataclass(frozen=True)
class LayerReader:
    excerpts: int  # failure excerpts the flow raised something on
    catalogue: float  # the catalogue's layer right (it was tuned on these)
    learned: float  # the learned reader's layer right, out of group
    category_majority: float  # the best a reader of the category alone could do on them


def layer_reader(rows: list[Labelled], l2: float = 0.0) -> LayerReader:
    raised = [r for r in rows if r.excerpt.is_fault and r.layer is not None]
    right = 0
    for train, test in _folds(raised):
        model = _reader(l2, one_of_many=True)
        for _ in range(EPOCHS):
            for r in train:
                model.learn_one(f"{r.excerpt.text}\ncategory_{r.category}", r.excerpt.layer)
        right += sum(model.predict_one(f"{r.excerpt.text}\ncategory_{r.category}") == r.excerpt.layer for r in test)
    by_category: dict[str | None, Counter[str]] = defaultdict(Counter)
    for r in raised:
        by_category[r.category][r.excerpt.layer] += 1
    n = max(len(raised), 1)
    return LayerReader(
        excerpts=len(raised),
        catalogue=sum(r.layer == r.excerpt.layer for r in raised) / n,
        learned=right / n,
        category_majority=sum(max(c.values()) for c in by_category.values()) / n,
    )


def report(paths: list[Path] | None = None) -> tuple[list[FaultReaderPoint], LayerReader]:
    """Measure both readers on ``paths`` (``tune`` and the open parts if none) and print the numbers."""
    rows = labelled(paths or open_parts())
    groups = len({r.group for r in rows})
    print(f"{len(rows)} open excerpts in {groups} groups, each scored by a model trained on the others")
    points = fault_reader(rows)
    print("fault reader (a line over the threshold flags its excerpt):")
    for p in points:
        got, of = p.unrecognised_flagged
        print(
            f"  healthy flagged {p.healthy_flagged:6.1%}  failures flagged {p.faults_flagged:6.1%}  "
            f"failures the catalogue does not recognise flagged {got}/{of}"
        )
    lr = layer_reader(rows)
    print(
        f"layer on {lr.excerpts} failures raised: catalogue {lr.catalogue:.3f} (tuned on them), "
        f"learned {lr.learned:.3f} (out of group), category's majority layer {lr.category_majority:.3f}"
    )
    return points, lr
