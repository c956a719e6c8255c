"""The same failure is read the same way however it was collected.

Launchers and log collectors put their own envelope in front of every line (a rank, a host,
a container stamp, a logging level, terminal colours), or wrap it in JSON (Docker's json-file
driver, journald's export). Every
real excerpt we hold, wrapped in each envelope, must give the first anomaly it gives bare:
same kind, category and layer, or nothing.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.paths import FIXTURES
from trainguard.benchmarks.corpus import CORPUS_DIR, ExcerptOutcome, evaluate

ENVELOPES: dict[str, Callable[[str, int], str]] = {
    "srun -l": lambda line, i: f"3: {line}",
    "[rankN]:": lambda line, i: f"[rank3]: {line}",
    "torchrun --tee": lambda line, i: f"[default3]:{line}",
    "mpirun --tag-output": lambda line, i: f"[1,3]<stderr>:{line}",
    "Ray actor": lambda line, i: f"(RayTrainWorker pid=48211, ip=10.0.3.7) {line}",
    "pdsh": lambda line, i: f"worker-3: {line}",
    "CRI container log": lambda line, i: f"2024-05-01T12:00:{i % 60:02d}.123456789Z stderr F {line}",
    "compose": lambda line, i: f"trainer-1  | {line}",
    "kubectl --prefix": lambda line, i: f"[pod/trainer-worker-3/pytorch] {line}",
    "Python logging": lambda line, i: f"2024-05-01 12:00:{i % 60:02d},123 - train - ERROR - {line}",
    "journald": lambda line, i: f"May 01 12:00:{i % 60:02d} gpu-node-07 python[4821]: {line}",
    "coloured logger": lambda line, i: f"\x1b[1;31m{line}\x1b[0m",
    "indented": lambda line, i: f"    {line}",
    "Docker json-file": lambda line, i: json.dumps(
        {"log": f"{line}\n", "stream": "stderr", "time": f"2024-05-01T12:00:{i % 60:02d}.123456789Z"}
    ),
    "Docker json-file, coloured": lambda line, i: json.dumps({"log": f"\x1b[1;31m{line}\x1b[0m\n", "stream": "stderr"}),
    "journalctl -o json": lambda line, i: json.dumps({"MESSAGE": line, "_HOSTNAME": "gpu-node-07", "PRIORITY": "3"}),
    "klog": lambda line, i: f"E0501 12:00:{i % 60:02d}.123456    4821 main.go:12] {line}",
    "Hydra": lambda line, i: f"[2024-05-01 12:00:{i % 60:02d},123][__main__][ERROR] - {line}",
    "rich": lambda line, i: f"[12:00:{i % 60:02d}] ERROR    {line}",
    "loguru": lambda line, i: f"2024-05-01 12:00:{i % 60:02d}.123 | ERROR    | train:main:42 - {line}",
}


def _excerpt_sets() -> list[Path]:
    sets = sorted(FIXTURES.glob("extra-real-logs*.jsonl"))
    tune = CORPUS_DIR / "tune.jsonl"
    return [*sets, tune] if tune.is_file() else sets


def _first(outcome: ExcerptOutcome) -> str:
    a = outcome.first
    return "nothing" if a is None else f"{a.kind}/{a.category}/{a.layer}"


@pytest.fixture(scope="module")
def excerpts(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[dict[str, str]], list[str]]:
    rows = [json.loads(line) for path in _excerpt_sets() for line in path.read_text().splitlines() if line.strip()]
    bare = tmp_path_factory.mktemp("bare") / "excerpts.jsonl"
    bare.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return rows, [_first(o) for o in evaluate(bare)]


@pytest.mark.parametrize("envelope", list(ENVELOPES))
def test_an_envelope_in_front_of_every_line_changes_nothing(
    envelope: str, excerpts: tuple[list[dict[str, str]], list[str]], tmp_path: Path
) -> None:
    rows, bare = excerpts
    wrap = ENVELOPES[envelope]
    wrapped = [{**r, "text": "\n".join(wrap(line, i) for i, line in enumerate(r["text"].splitlines()))} for r in rows]
    path = tmp_path / "wrapped.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in wrapped))
    changed = [
        (r["source"], was, now)
        for r, was, now in zip(rows, bare, map(_first, evaluate(path)), strict=True)
        if was != now
    ]
    assert not changed, changed[:5]
