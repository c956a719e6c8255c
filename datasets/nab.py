"""NAB scoring with NAB's own rules: ``trainguard bench nab [--detector NAME]``.

The Numenta Anomaly Benchmark rewards early detection inside labelled anomaly
windows and penalises false positives, through a scaled sigmoid of each
detection's position relative to the windows. This module reimplements its
scorer (NAB v1.1 ``sweeper.py``): a probationary period of 15 % of each file (at
most 750 rows) where nothing counts; within a window only the best (earliest)
detection counts, scaled so a detection at the window's start earns ``tpWeight``;
a detection outside windows costs ``fpWeight`` times a sigmoid of its distance
past the previous window (the full weight before any window); each missed window
costs ``fnWeight``. One threshold per profile is chosen to maximise the total
over the corpus, and the total is normalised so the null detector (no
detections) scores 0 and the perfect one 100.

``trainguard bench nab --detector windowedGaussian`` reruns NAB's own
windowed-Gaussian baseline, whose published optimised raw score this scorer
reproduces (``tests/unit/datasets/test_nab.py``).
"""

from __future__ import annotations

import csv
import json
import math
import time
from bisect import bisect_right
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import numpy as np

NAB_DIR = Path(__file__).resolve().parents[2] / "shared" / "datasets" / "nab"
PROBATION_PERCENT = 0.15


@dataclass(frozen=True)
class Profile:
    tp: float
    fp: float
    fn: float


@dataclass
class DataFile:
    name: str
    timestamps: list[datetime]
    values: np.ndarray
    windows: list[tuple[int, int]]  # inclusive row index ranges


def load_profiles(nab_dir: Path = NAB_DIR) -> dict[str, Profile]:
    raw = json.loads((nab_dir / "config" / "profiles.json").read_text())
    return {
        name: Profile(c["CostMatrix"]["tpWeight"], c["CostMatrix"]["fpWeight"], c["CostMatrix"]["fnWeight"])
        for name, c in raw.items()
    }


def _parse(ts: str) -> datetime:
    return datetime.fromisoformat(ts.strip())


def load_corpus(nab_dir: Path = NAB_DIR) -> list[DataFile]:
    """Every labelled data file, with its anomaly windows as row index ranges."""
    windows = json.loads((nab_dir / "labels" / "combined_windows.json").read_text())
    files = []
    for name in sorted(windows):
        with (nab_dir / "data" / name).open() as fh:
            rows = list(csv.DictReader(fh))
        stamps = [_parse(r["timestamp"]) for r in rows]
        ranges = []
        for start, end in windows[name]:
            lo = bisect_right(stamps, _parse(start) - (stamps[1] - stamps[0]) * 0) - 1
            lo = next(i for i in range(max(lo, 0), len(stamps)) if stamps[i] >= _parse(start))
            hi = bisect_right(stamps, _parse(end)) - 1
            ranges.append((lo, hi))
        files.append(DataFile(name, stamps, np.array([float(r["value"]) for r in rows]), ranges))
    return files


def probation_length(rows: int) -> int:
    return int(min(math.floor(PROBATION_PERCENT * rows), PROBATION_PERCENT * 5000))


def scaled_sigmoid(position: float) -> float:
    """NAB's reward curve: ~1 at a window's start, 0 at its end, towards -1 after it."""
    if position > 3.0:
        return -1.0
    return 2.0 / (1.0 + math.exp(5.0 * position)) - 1.0


_MAX_TP = scaled_sigmoid(-1.0)


@dataclass(frozen=True)
class _Point:
    score: float  # detector output
    window: int  # -1 outside windows, -2 probationary, else a corpus-wide window id
    tp_value: float  # unweighted reward if detected (in a window)
    fp_value: float  # unweighted penalty if detected (outside windows)


def _points(f: DataFile, scores: np.ndarray, window_base: int) -> list[_Point]:
    probation = probation_length(len(f.values))
    out = []
    previous: tuple[int, int] | None = None
    w = 0
    for i, score in enumerate(scores):
        while w < len(f.windows) and f.windows[w][1] < i:
            previous = f.windows[w]
            w += 1
        if i < probation:
            out.append(_Point(float(score), -2, 0.0, 0.0))
            continue
        if w < len(f.windows) and f.windows[w][0] <= i <= f.windows[w][1]:
            lo, hi = f.windows[w]
            position = -(hi - i + 1) / (hi - lo + 1)
            out.append(_Point(float(score), window_base + w, scaled_sigmoid(position) / _MAX_TP, 0.0))
        elif previous is None:
            out.append(_Point(float(score), -1, 0.0, -1.0))
        else:
            lo, hi = previous
            position = abs(hi - i) / (hi - lo)
            out.append(_Point(float(score), -1, 0.0, scaled_sigmoid(position)))
    return out


def best_threshold(points: list[_Point], windows: int, profile: Profile) -> tuple[float, float]:
    """``(threshold, raw score)`` maximising the corpus score (a point is detected when score >= threshold)."""
    ordered = sorted(points, key=lambda p: -p.score)
    total = -profile.fn * windows
    best = (1.1, total)
    hit: dict[int, float] = {}
    for i, p in enumerate(ordered):
        if p.window >= 0:
            reward = p.tp_value * profile.tp
            if p.window not in hit:
                total += reward + profile.fn
                hit[p.window] = reward
            elif reward > hit[p.window]:
                total += reward - hit[p.window]
                hit[p.window] = reward
        elif p.window == -1:
            total += p.fp_value * profile.fp
        if (i + 1 == len(ordered) or ordered[i + 1].score != p.score) and total > best[1]:
            best = (p.score, total)
    return best


@dataclass
class NabResult:
    scores: dict[str, float]  # normalised, per profile
    raw: dict[str, float]
    thresholds: dict[str, float]


def score_corpus(
    detect: Callable[[np.ndarray, list[datetime]], Iterable[float]],
    corpus: list[DataFile] | None = None,
    nab_dir: Path = NAB_DIR,
    profiles: dict[str, Profile] | None = None,
) -> NabResult:
    """Run ``detect`` (values, timestamps → anomaly scores in [0, 1]) on every file and score it."""
    corpus = corpus if corpus is not None else load_corpus(nab_dir)
    profiles = profiles if profiles is not None else load_profiles(nab_dir)
    points: list[_Point] = []
    windows = 0
    for f in corpus:
        scores = np.asarray(list(detect(f.values, f.timestamps)), dtype=float)
        if len(scores) != len(f.values):
            raise ValueError(f"{f.name}: detector returned {len(scores)} scores for {len(f.values)} rows")
        points += _points(f, scores, windows)
        windows += len(f.windows)
    result = NabResult({}, {}, {})
    for name, profile in profiles.items():
        threshold, raw = best_threshold(points, windows, profile)
        null, perfect = -profile.fn * windows, profile.tp * windows
        result.thresholds[name] = threshold
        result.raw[name] = raw
        result.scores[name] = 100.0 * (raw - null) / (perfect - null)
    return result


def windowed_gaussian(values: np.ndarray, timestamps: list[datetime]) -> list[float]:
    """NAB's ``windowedGaussian`` baseline, as NAB ships it (window 6400, step 100, Gaussian tail)."""
    window: list[float] = []
    step: list[float] = []
    total = total_sq = 0.0
    mean, std = 0.0, 1.0
    out = []
    for value in values:
        score = 0.0
        if window:
            z = abs(value - mean) / std
            score = 1.0 - 0.5 * math.erfc(z / math.sqrt(2.0))
        if len(window) < 6400:
            # While the window fills, keep running sums instead of recomputing (same mean and std).
            window.append(value)
            total += value
            total_sq += value * value
            mean = total / len(window)
            std = math.sqrt(max(total_sq / len(window) - mean * mean, 0.0)) or 0.000001
        else:
            step.append(value)
            if len(step) == 100:
                window = window[100:] + step
                step = []
                mean, std = float(np.mean(window)), float(np.std(window)) or 0.000001
        out.append(score)
    return out


def null_detector(values: np.ndarray, timestamps: list[datetime]) -> list[float]:
    return [0.0] * len(values)


def trainguard_detector(values: np.ndarray, timestamps: list[datetime]) -> list[float]:
    from trainguard.detectors.drift import DriftDetector

    detector = DriftDetector()
    return [detector.score_one(float(v)) for v in values]


DETECTORS = {"trainguard": trainguard_detector, "windowedGaussian": windowed_gaussian, "null": null_detector}


def report(detector: str = "trainguard", nab_dir: Path = NAB_DIR) -> None:
    """Score ``detector`` on NAB with NAB's rules and print the three profiles."""
    if detector not in DETECTORS:
        raise ValueError(f"unknown detector {detector!r}; the detectors are: {', '.join(sorted(DETECTORS))}.")
    started = time.perf_counter()
    corpus = load_corpus(nab_dir)
    rows = sum(len(f.values) for f in corpus)
    result = score_corpus(DETECTORS[detector], corpus, nab_dir)
    elapsed = time.perf_counter() - started
    print(
        f"NAB {len(corpus)} files, {rows:,} rows, {sum(len(f.windows) for f in corpus)} windows; "
        f"detector {detector} ({elapsed:.1f}s)"
    )
    for name in ("standard", "reward_low_FP_rate", "reward_low_FN_rate"):
        print(
            f"  {name:<20} score {result.scores[name]:6.2f}   raw {result.raw[name]:9.3f}   "
            f"threshold {result.thresholds[name]:.4f}"
        )
