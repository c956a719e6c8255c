"""Accuracy of the signature catalogue on real log excerpts: ``python -m datasets.excerpts [PATH]``.

Each excerpt of ``real-log-excerpts.jsonl`` (verbatim text from public issue
threads and training chronicles) is labelled with a failure family and the layer
to blame. An excerpt counts as right when the catalogue names the same family and
layer; ``normal_progress`` excerpts must match no signature at all, and ``other``
excerpts (loss spikes, throughput drops, corrected PCIe errors) must not be
mistaken for a failure — either nothing matches, or a warning of family
``other`` with the right layer.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path

from detectors.signatures import classify_text, family_of

DEFAULT_PATH = Path(__file__).resolve().parents[2] / "shared" / "datasets" / "real-log-excerpts.jsonl"
_LAYER = {"system-software": "system"}


@dataclass(frozen=True)
class ExcerptResult:
    index: int
    label: str
    layer: str
    got_family: str | None
    got_layer: str | None
    correct: bool


def evaluate(path: Path = DEFAULT_PATH) -> list[ExcerptResult]:
    results = []
    for index, line in enumerate(path.read_text().splitlines()):
        item = json.loads(line)
        label, layer = item["label"], _LAYER.get(item["layer"], item["layer"])
        match = classify_text(item["text"])
        family = None if match is None else family_of(match.signature.category)
        got_layer = None if match is None else match.signature.layer
        if label == "normal_progress":
            correct = match is None
        elif label == "other":
            correct = match is None or (family == "other" and got_layer == layer)
        else:
            correct = (family, got_layer) == (label, layer)
        results.append(ExcerptResult(index, label, layer, family, got_layer, correct))
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("path", nargs="?", type=Path, default=DEFAULT_PATH)
    args = parser.parse_args()
    results = evaluate(args.path)
    right = sum(r.correct for r in results)
    for r in results:
        if not r.correct:
            print(f"  wrong #{r.index}: labelled {r.label}/{r.layer}, got {r.got_family}/{r.got_layer}")
    print(f"excerpt accuracy: {right}/{len(results)} = {right / len(results):.1%} (family and layer)")


if __name__ == "__main__":
    main()
