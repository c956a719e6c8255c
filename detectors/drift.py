"""Online anomaly score for one metric stream (a GPU's temperature, power, clock…), in microseconds.

Four surprises are computed for each value, from the stream's own past only:

* **level** – distance from an exponentially weighted mean, in exponentially weighted standard deviations;
* **volatility** – how far the recent variance of the steps is from their long-run variance (log ratio);
* **shape**, at two time scales – the distance from the latest window of 4 block means (blocks of 4 values,
  and of 16) to the nearest earlier window (a left matrix profile), in units of the range seen so far.

Each surprise is averaged over the last 10 values and compared with its own running distribution, as
Numenta's ``AnomalyLikelihood`` does: the Gaussian tail probability ``p`` of the average, on a log scale
(``log(p) / log(1e-10)``: 0.5 is p = 1e-5, 0.9 is p = 1e-9); a tail event right after another one counts
as p = 1e-3, so a disturbance alerts once. The score is the largest of the four (none during the first
``probation`` values); after one ≥ 0.5, those of the next ``refractory`` values are quartered. A value
outside the range seen so far by more than 5 % of it (Numenta's "spatial anomaly"; after ``warmup``
values) scores at least 0.6 regardless, up to 0.999 as it leaves the range by more than the step noise.

0.5 is the alert level NAB's scorer picks (``trainguard bench nab``: 72.1 standard, 63.7
reward_low_FP_rate, 76.8 reward_low_FN_rate with one configuration for all 58 files; HTM 70.5, ARTime
74.9). NAB tolerates false alarms (one costs a ninth of a detection), and at 0.5 pure noise alerts about
once in 1,300 values. For a stream that should sit still, such as an idle GPU's, alert at 0.9: Gaussian
noise never reached it in 2 million values, Laplace noise once in ~130,000. It costs ~10 µs a value and
holds at most ~70 KiB (2 × 2000 windows of float32).

>>> det = DriftDetector()
>>> scores = [det.score_one(10.0 + (i % 7) * 0.1) for i in range(2000)]
>>> max(scores[1000:]) < 0.2  # a stream that only repeats itself is no surprise
True
>>> det.score_one(25.0)  # far outside everything seen
0.999
>>> sum(det.score_one(25.0) >= 0.5 for _ in range(1000)) <= 1  # then the new level soon is the new normal
True
>>> import random
>>> rng, det = random.Random(7), DriftDetector()
>>> max(det.score_one(35.0 + rng.gauss(0.0, 0.8)) for _ in range(5000)) < 0.9  # sensor noise, no alert
True
>>> det = DriftDetector()
>>> scores = [det.score_one(10.3 if 1500 <= i < 1530 else 10.0 + (i % 7) * 0.1) for i in range(2000)]
>>> max(scores[1000:1500]) < 0.2, max(scores[1500:1530]) > 0.9  # stuck at 10.3: in the range, not the pattern
(True, True)
"""

from __future__ import annotations

import math
from array import array
from collections import deque

import numpy as np

_LOG_1E_10 = math.log(1e-10)


class _WindowNovelty:
    """Distance from the latest window of ``width`` block means (blocks of ``block`` values) to its nearest
    predecessor, in raw units (root mean square over the window). Windows overlapping the latest one are not
    candidates; at most ``memory`` windows are kept (the oldest is overwritten)."""

    __slots__ = (
        "_count",
        "_next",
        "_pending",
        "_recent",
        "_ref",
        "_size",
        "_store",
        "_sum",
        "block",
        "memory",
        "value",
        "width",
    )

    def __init__(self, block: int, width: int, memory: int) -> None:
        self.block = block
        self.width = width
        self.memory = memory
        self.value = 0.0
        self._sum = 0.0
        self._count = 0
        self._ref: float | None = None  # first value, subtracted to keep float32 precision
        # Lists, and the store made when first needed: an idle node holds two of these per GPU and metric,
        # and a deque weighs 600 bytes before it holds anything.
        self._recent: list[float] = []
        self._pending: list[np.ndarray] = []
        self._store: np.ndarray | None = None
        self._size = 0
        self._next = 0

    def __setstate__(self, state: tuple[None, dict[str, object]]) -> None:
        # Snapshots written before the lists held deques (and always a store): the same values.
        for name, value in state[1].items():
            setattr(self, name, list(value) if isinstance(value, deque) else value)

    def update(self, x: float) -> float:
        """Learn ``x``; return the latest window's distance (it changes once a block)."""
        if self._ref is None:
            self._ref = x
        self._sum += x - self._ref
        self._count += 1
        if self._count < self.block:
            return self.value
        recent = self._recent
        recent.append(self._sum / self.block)
        if len(recent) > self.width:
            del recent[0]
        self._sum = 0.0
        self._count = 0
        if len(recent) < self.width:
            return self.value
        window = np.array(recent, dtype=np.float32)
        if self._size:
            diff = self._store[: self._size] - window  # type: ignore[index]
            self.value = math.sqrt(float(np.einsum("ij,ij->i", diff, diff).min()) / self.width)
        self._pending.append(window)
        if len(self._pending) > self.width:
            self._keep(self._pending.pop(0))
        return self.value

    def _keep(self, window: np.ndarray) -> None:
        if self._store is None:
            self._store = np.empty((16, self.width), dtype=np.float32)
        if self._size < self.memory:
            if self._size == len(self._store):
                grown = np.empty((min(2 * self._size, self.memory), self.width), dtype=np.float32)
                grown[: self._size] = self._store
                self._store = grown
            self._store[self._size] = window
            self._size += 1
        else:
            self._store[self._next] = window
            self._next = (self._next + 1) % self.memory


class _Ewm:
    """The exponentially weighted moments of the detector before session 4's model.

    Kept only so that recovery snapshots written by that version unpickle; a detector restored
    from one starts learning its stream afresh (see :meth:`DriftDetector.__setstate__`).
    """

    def __setstate__(self, state: object) -> None:
        pass


class DriftDetector:
    """Score each new value of one stream in [0, 1); higher is more anomalous (see the module for the scale).

    ``level_alpha`` and ``step_alphas`` (short, long) weight the level and step-variance averages;
    ``shapes`` are the (block, width) of the windows compared; ``smoothing`` values are averaged before the
    tail probability, whose distribution follows the last ~``history`` averages, skips the first
    ``learning`` values and is used from value ``probation`` on.
    """

    def __init__(
        self,
        level_alpha: float = 0.003,
        step_alphas: tuple[float, float] = (0.1, 0.003),
        shapes: tuple[tuple[int, int], ...] = ((4, 4), (16, 4)),
        shape_memory: int = 2000,
        spatial_tolerance: float = 0.05,
        warmup: int = 200,
        smoothing: int = 10,
        history: int = 2000,
        probation: int = 300,
        learning: int = 150,
        refractory: int = 200,
    ) -> None:
        self.level_alpha = level_alpha
        self.short_alpha, self.long_alpha = step_alphas
        self.spatial_tolerance = spatial_tolerance
        self.warmup = warmup
        self.smoothing = smoothing
        self.history = history
        self.probation = probation
        self.learning = learning
        self.refractory = refractory
        self._shapes = [_WindowNovelty(block, width, shape_memory) for block, width in shapes]
        k = 2 + len(self._shapes)
        self._n = 0
        self._lo = self._hi = 0.0
        self._mean = self._var = 0.0  # level
        self._previous = 0.0
        self._short = self._long = 0.0  # step variances
        # The last raw surprises, ``k`` per value, as doubles (an idle node keeps two detectors per GPU).
        self._ring = array("d", bytes(8 * k * smoothing))
        self._sums = [0.0] * k
        self._est_n = 0  # running distribution of the smoothed surprises
        self._est_mean = [0.0] * k
        self._est_var = [0.0] * k
        self._tail_mean = [0.5] * k  # the distribution in use (re-read every 100 values)
        self._tail_std = [1e3] * k
        self._was_red = [False] * k
        self._last_alert = -(10**9)

    def __setstate__(self, state: dict[str, object]) -> None:
        if "_shapes" not in state:  # the previous model's state: relearn this stream with this model
            self.__init__()  # type: ignore[misc]
            return
        if isinstance(state["_ring"], list):  # written when the ring was a list of lists
            state["_ring"] = array("d", [raw for raws in state["_ring"] for raw in raws])  # type: ignore[union-attr]
        self.__dict__.update(state)

    def score_one(self, x: float) -> float:
        """Score ``x``, then learn from it. A value that is not finite scores 0 and is not learned."""
        if not math.isfinite(x):
            return 0.0
        self._n += 1
        n = self._n
        novel = noise = 0.0  # how far outside the range seen so far (beyond the tolerance); the step noise
        if n == 1:
            self._lo = self._hi = self._mean = self._previous = x
        else:
            span = self._hi - self._lo
            if n > self.warmup and span > 0.0:
                tolerance = self.spatial_tolerance * span
                novel = max(x - self._hi - tolerance, self._lo - tolerance - x, 0.0)
                noise = math.sqrt(self._long / 2.0)
            if x > self._hi:
                self._hi = x
            elif x < self._lo:
                self._lo = x
        span = self._hi - self._lo

        # Raw surprises, each in [0, 1).
        d = x - self._mean
        a = self.level_alpha
        z = abs(d) / (math.sqrt(self._var) + 1e-9 + 1e-6 * abs(self._mean))
        self._mean += a * d
        self._var = (1.0 - a) * (self._var + a * d * d)
        step = x - self._previous
        self._previous = x
        self._short += self.short_alpha * (step * step - self._short)
        self._long += self.long_alpha * (step * step - self._long)
        volatility = abs(math.log((self._short + 1e-12) / (self._long + 1e-12))) / 5.0
        raws = [1.0 - math.exp(-z / 3.0), volatility if volatility < 1.0 else 1.0]
        for shape in self._shapes:
            distance = shape.update(x)
            raws.append(1.0 - math.exp(-10.0 * distance / span) if span > 0.0 else 0.0)

        # Moving averages of the raw surprises.
        ring, k = self._ring, len(raws)
        start = (n - 1) % self.smoothing * k
        sums = self._sums
        for i, raw in enumerate(raws):
            sums[i] += raw - ring[start + i]
            ring[start + i] = raw
        count = n if n < self.smoothing else self.smoothing
        smoothed = [s / count for s in sums]

        # Tail probability of each average against its own running distribution.
        score = 0.0
        it = n - 1
        if it >= self.probation:
            if it % 100 == 0 or it == self.probation:
                self._reestimate()
            for i, value in enumerate(smoothed):
                mean = self._tail_mean[i]
                p = 0.5 * math.erfc(abs(value - mean) / self._tail_std[i] / math.sqrt(2.0))
                red = p <= 1e-5
                if red and self._was_red[i]:
                    p = 1e-3
                self._was_red[i] = red
                log_score = math.log(p + 1e-10) / _LOG_1E_10
                if log_score > score:
                    score = log_score
        if it >= self.learning:
            self._est_n += 1
            a = 1.0 / min(self._est_n, self.history)
            for i, value in enumerate(smoothed):
                d = value - self._est_mean[i]
                self._est_mean[i] += a * d
                self._est_var[i] = (1.0 - a) * (self._est_var[i] + a * d * d)

        if n - self._last_alert <= self.refractory:
            score *= 0.25
        elif score >= 0.5:
            self._last_alert = n
        if novel > 0.0:
            # A new extreme: 0.6 just past the tolerance, towards 0.999 as it leaves the range by more than the
            # noise of the steps (a record of the noise itself stays low, a jump does not).
            spatial = 0.999 - 0.399 * math.exp(-novel / (2.0 * noise)) if noise > 0.0 else 0.999
            return max(spatial, min(score, 0.999))
        return min(score, 0.999)

    def _reestimate(self) -> None:
        if self._est_n < 2:
            return
        self._tail_mean = [max(m, 0.03) for m in self._est_mean]
        self._tail_std = [math.sqrt(max(v, 0.0003)) for v in self._est_var]
